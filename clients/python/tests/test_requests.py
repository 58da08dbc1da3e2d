"""Requests answered from Python: an ACP agent (tests/fake-acp) asks to
run a command under a policy that asks; `requests.handle` answers from
another connection, and the answer decides whether the command ran."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import support
from sandhold import Chunk, ChunkType, FailedPrecondition, Policy, Rule, Sandhold
from sandhold.v1 import run_pb2

FAKE_ACP = support.REPO / "tests" / "fake-acp" / "fake_acp_agent.py"


def start_asking(client: Sandhold, definition_id: str, command: str, log: Path) -> tuple[str, str]:
    thread = f"py-ask-{uuid.uuid4().hex[:8]}"
    run = client.runs.start(
        thread_id=thread, definition_id=definition_id, harness="acp", prompt="go",
        command=["python3", str(FAKE_ACP), "--log", str(log), "--ask", command],
        policy=Policy(default="allow", rules=[Rule("command", "*", "ask")]),
    )
    next(iter(run))  # accepted; it goes on without this stream
    run.close()
    return run.run_id, thread


@pytest.mark.parametrize("allow", [True, False])
def test_a_permission_is_answered_from_python(client: Sandhold, local_definition: str, tmp_path: Path,
                                              allow: bool) -> None:
    run_id, _ = start_asking(client, local_definition, "echo hi > asked.txt", tmp_path / "acp.log")
    asked: list[Chunk] = []

    def decide(chunk: Chunk) -> tuple[bool, str]:
        asked.append(chunk)
        return allow, "" if allow else "not here"

    answers = client.requests.handle(run_id, permission=decide)
    assert [(a.kind, a.allowed, a.answered_by) for a in answers] == [("permission", allow, "client")]
    assert asked[0].request is not None and asked[0].request.kind == "permission"
    chunks = list(client.runs.stream(run_id))
    resolved = [c for c in chunks if c.type is ChunkType.PERMISSION_RESOLVED]
    assert len(resolved) == 1 and resolved[0].request is not None and resolved[0].request.allowed == allow
    assert chunks[-1].type is ChunkType.RUN_FINISHED
    sandbox = client.runs.get(run_id).sandbox_id
    assert client.sandboxes.exec(sandbox, "test -e asked.txt").ok == allow
    listed = client.requests.list(run_id, include_answered=True)
    assert [(r.request_id, r.answered) for r in listed] == [(answers[0].request_id, True)]
    assert client.requests.list(run_id) == []
    # A second answer is refused by reason.
    with pytest.raises(FailedPrecondition):
        client.requests.deny(run_id, answers[0].request_id)


def test_a_client_tool_runs_in_python(client: Sandhold, local_definition: str, tmp_path: Path) -> None:
    claude = support.cli("claude")
    model = support.FakeModel("client-tool", tmp_path / "model.log")
    home = tmp_path / "home"
    home.mkdir()
    try:
        options = run_pb2.HarnessOptions(program=claude, env={
            "HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{model.port}", "ANTHROPIC_API_KEY": "x"})
        run = client.runs.start(
            thread_id=f"py-tool-{uuid.uuid4().hex[:8]}", definition_id=local_definition, harness="claude-code",
            prompt="ask the tool", options=options,
            client_tools=[run_pb2.ClientTool(name="lookup", description="Looks a question up")],
        )
        next(iter(run))
        run.close()
        asked: list[object] = []

        def lookup(tool_input: object) -> str:
            asked.append(tool_input)
            return "forty-two"

        answers = client.requests.handle(run.run_id, tools={"lookup": lookup})
        text = "".join(c.text for c in client.runs.stream(run.run_id))
    finally:
        model.stop()
    assert asked == [{"query": "the question"}]
    assert [(a.kind, a.answered_by) for a in answers] == [("client_tool", "client")]
    assert "The client tool said: forty-two" in text
