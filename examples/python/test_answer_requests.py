"""The request-answering example against a real server: an ACP agent (the
fake one in tests/fake-acp) asks to run a shell command under a policy that
asks for commands; the example answers from another connection, and the
answer decides whether the command ran."""

import os
import uuid

import grpc

from answer_requests import answer_requests
from conftest import TOKEN
from durable_run import ensure_sandbox, metadata
from sandhold.v1 import events_pb2, run_pb2, run_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_ACP = os.path.join(REPO, "tests", "fake-acp", "fake_acp_agent.py")


def start_asking_run(server, thread_id, command, log):
    """A durable ACP run whose agent asks to run `command`; returns its id."""
    run_id = f"ask-{uuid.uuid4().hex[:10]}"
    policy = sandbox_pb2.SandboxPolicy(
        default=sandbox_pb2.POLICY_EFFECT_ALLOW,
        rules=[sandbox_pb2.PolicyRule(action=sandbox_pb2.POLICY_ACTION_COMMAND, pattern="*",
                                      effect=sandbox_pb2.POLICY_EFFECT_ASK)],
    )
    request = run_pb2.StartRunRequest(
        thread_id=thread_id, run_id=run_id, definition_id="python-example", durable=True, harness="acp",
        options=run_pb2.HarnessOptions(command=["python3", FAKE_ACP, "--log", log, "--ask", command]),
        prompt="go", policy=policy,
    )
    with grpc.insecure_channel(server) as ch:
        stream = run_pb2_grpc.RunServiceStub(ch).StartRun(request, metadata=metadata(TOKEN))
        for event in stream:  # until the run is accepted; it goes on without us
            if event.HasField("chunk"):
                break
    return run_id


def sandbox_has(server, sandbox_id, path):
    with grpc.insecure_channel(server) as ch:
        sandboxes = sandbox_pb2_grpc.SandboxServiceStub(ch)
        r = sandboxes.Exec(sandbox_pb2.ExecRequest(sandbox_id=sandbox_id,
                                                   command=sandbox_pb2.Command(shell=f"test -e {path}")),
                           metadata=metadata(TOKEN))
        return r.status.code == 0


def types_of(server, run_id):
    with grpc.insecure_channel(server) as ch:
        runs = run_pb2_grpc.RunServiceStub(ch)
        events = runs.AttachRun(run_pb2.AttachRunRequest(run_id=run_id, stored_only=True), metadata=metadata(TOKEN))
        return [e.chunk.chunk for e in events if e.HasField("chunk")]


def test_an_allowed_command_runs_and_a_denied_one_does_not(server, tmp_path):
    for command, allowed in (("echo hi > allowed.txt", True), ("rm -f x; echo hi > denied.txt", False)):
        thread = f"answer-{uuid.uuid4().hex[:8]}"
        ready = ensure_sandbox(server, TOKEN, thread)
        run_id = start_asking_run(server, thread, command, str(tmp_path / f"{thread}.log"))
        answers = answer_requests(server, TOKEN, run_id)
        assert [(kind, ok) for _, kind, ok in answers] == [("permission", allowed)]
        target = "allowed.txt" if allowed else "denied.txt"
        assert sandbox_has(server, ready.sandbox_id, target) == allowed
        chunks = types_of(server, run_id)
        asked = [c for c in chunks if c.type == events_pb2.CHUNK_TYPE_PERMISSION_REQUESTED]
        resolved = [c for c in chunks if c.type == events_pb2.CHUNK_TYPE_PERMISSION_RESOLVED]
        assert len(asked) == 1 and len(resolved) == 1
        assert resolved[0].request.allowed == allowed and resolved[0].request.answered_by == "client"
        assert chunks[-1].type == events_pb2.CHUNK_TYPE_RUN_FINISHED


def test_a_second_answer_is_refused(server, tmp_path):
    thread = f"answer-{uuid.uuid4().hex[:8]}"
    ensure_sandbox(server, TOKEN, thread)
    run_id = start_asking_run(server, thread, "echo once > once.txt", str(tmp_path / "once.log"))
    first = answer_requests(server, TOKEN, run_id)
    assert len(first) == 1
    request_id = first[0][0]
    with grpc.insecure_channel(server) as ch:
        runs = run_pb2_grpc.RunServiceStub(ch)
        again = run_pb2.RespondToRequestRequest(run_id=run_id, request_id=request_id,
                                                permission=run_pb2.PermissionAnswer(allow=False))
        try:
            runs.RespondToRequest(again, metadata=metadata(TOKEN))
            raise AssertionError("a second answer was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
