"""The request-answering example against a real server: an ACP agent (the
fake one in tests/fake-acp) asks to run a shell command under a policy that
asks for commands; the example answers from another connection, and the
answer decides whether the command ran."""

import os
import uuid

import pytest

from answer_requests import answer_requests
from conftest import TOKEN
from durable_run import DEFINITION_ID, ensure_sandbox
from sandhold import ChunkType, FailedPrecondition, Policy, Rule, Sandhold

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_ACP = os.path.join(REPO, "tests", "fake-acp", "fake_acp_agent.py")


def start_asking_run(server, thread_id, command, log):
    """A durable ACP run whose agent asks to run `command`; returns its id."""
    with Sandhold(server, token=TOKEN) as client:
        run = client.runs.start(
            thread_id=thread_id, definition_id=DEFINITION_ID, harness="acp", prompt="go",
            command=["python3", FAKE_ACP, "--log", log, "--ask", command],
            policy=Policy(default="allow", rules=[Rule("command", "*", "ask")]),
        )
        next(iter(run))  # until the run is accepted; it goes on without us
        run.close()
    return run.run_id


def sandbox_has(server, sandbox_id, path):
    with Sandhold(server, token=TOKEN) as client:
        return client.sandboxes.exec(sandbox_id, f"test -e {path}").ok


def chunks_of(server, run_id):
    with Sandhold(server, token=TOKEN) as client:
        return list(client.runs.stream(run_id))


def test_an_allowed_command_runs_and_a_denied_one_does_not(server, tmp_path):
    for command, allowed in (("echo hi > allowed.txt", True), ("rm -f x; echo hi > denied.txt", False)):
        thread = f"answer-{uuid.uuid4().hex[:8]}"
        ready = ensure_sandbox(server, TOKEN, thread)
        run_id = start_asking_run(server, thread, command, str(tmp_path / f"{thread}.log"))
        answers = answer_requests(server, TOKEN, run_id)
        assert [(kind, ok) for _, kind, ok in answers] == [("permission", allowed)]
        target = "allowed.txt" if allowed else "denied.txt"
        assert sandbox_has(server, ready.sandbox_id, target) == allowed
        chunks = chunks_of(server, run_id)
        asked = [c for c in chunks if c.type is ChunkType.PERMISSION_REQUESTED]
        resolved = [c for c in chunks if c.type is ChunkType.PERMISSION_RESOLVED]
        assert len(asked) == 1 and len(resolved) == 1
        assert resolved[0].request.allowed == allowed and resolved[0].request.answered_by == "client"
        assert chunks[-1].type is ChunkType.RUN_FINISHED


def test_a_second_answer_is_refused(server, tmp_path):
    thread = f"answer-{uuid.uuid4().hex[:8]}"
    ensure_sandbox(server, TOKEN, thread)
    run_id = start_asking_run(server, thread, "echo once > once.txt", str(tmp_path / "once.log"))
    first = answer_requests(server, TOKEN, run_id)
    assert len(first) == 1
    request_id = first[0][0]
    with Sandhold(server, token=TOKEN) as client, pytest.raises(FailedPrecondition):
        client.requests.deny(run_id, request_id)
