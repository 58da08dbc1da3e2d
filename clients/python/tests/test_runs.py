"""Runs from Python against a real server: start, stream (resuming after
dropped connections, every chunk once), the records, cancel, delete."""

from __future__ import annotations

import time
import uuid

import support
from sandhold import ChunkType, NotFound, Reconnect, RunStatus, Sandhold, definition


def thread() -> str:
    return f"py-{uuid.uuid4().hex[:10]}"


def test_a_command_run_streams_its_text_and_completes(client: Sandhold, local_definition: str) -> None:
    progress = []
    run = client.runs.start(thread_id=thread(), definition_id=local_definition,
                            command=["sh", "-c", "cat made.txt; echo hi"], on_progress=progress.append)
    chunks = list(run)
    assert "".join(c.text for c in chunks) == "made\nhi\n"
    assert run.completed and chunks[-1].type is ChunkType.RUN_FINISHED
    assert run.last_offset == chunks[-1].offset
    assert any(p.phase == "SETUP" for p in progress)
    record = client.runs.get(run.run_id)
    assert record.run_id == run.run_id and record.harness == "command"


def test_a_durable_run_survives_dropped_connections(server: support.Server, local_definition: str) -> None:
    proxy = support.Proxy([server.port])
    reconnects: list[Reconnect] = []
    try:
        with Sandhold(proxy.address, token=server.token) as client:
            run = client.runs.start(thread_id=thread(), definition_id=local_definition,
                                    command=support.numbered_lines(40, 0.05), on_reconnect=reconnects.append)
            text, offsets, types = "", [], []
            for chunk in run:
                offsets.append(chunk.offset)
                types.append(chunk.type)
                text += chunk.text
                # Cut once while StartRun streams, once while the resumed AttachRun does.
                if proxy.cuts == 0 and "line-5\n" in text:
                    proxy.cut()
                if proxy.cuts == 1 and reconnects and "line-20\n" in text:
                    proxy.cut()
    finally:
        proxy.close()
    assert text.split() == [f"line-{i}" for i in range(1, 41)]
    assert proxy.cuts == 2 and len(reconnects) >= 2
    assert len(set(offsets)) == len(offsets), "an offset was delivered twice"
    assert types.count(ChunkType.RUN_STARTED) == 1 and types[-1] is ChunkType.RUN_FINISHED
    with server.client() as client:
        assert [c.offset for c in client.runs.stream(run.run_id)] == offsets
        rest = [c.offset for c in client.runs.stream(run.run_id, after_offset=offsets[3])]
        assert rest == offsets[4:]


def test_records_list_active_cancel_delete(client: Sandhold, local_definition: str) -> None:
    t = thread()
    run = client.runs.start(thread_id=t, definition_id=local_definition, command=["sleep", "600"])
    first = next(iter(run))
    assert first.run_id == run.run_id
    active = client.runs.active(t)
    assert active is not None and active.run_id == run.run_id and active.status is RunStatus.RUNNING
    assert [r.run_id for r in client.runs.list(thread_id=t)] == [run.run_id]
    assert client.runs.list(query=run.run_id, status=RunStatus.RUNNING)[0].run_id == run.run_id
    assert client.runs.cancel(run.run_id).cancel_requested
    run.close()
    last = list(client.runs.stream(run.run_id))[-1]
    assert last.type is ChunkType.RUN_ERROR and last.error_code == "CANCELLED"
    client.runs.delete(run.run_id)
    try:
        client.runs.get(run.run_id)
        raise AssertionError("a deleted run was found")
    except NotFound as e:
        assert e.reason == "NOT_FOUND"


def test_attempts_are_compared_and_one_promoted(client: Sandhold) -> None:
    client.definitions.put(definition("py-attempts", local=True, portable_snapshots=True,
                                      setup=["echo base > base.txt"]))
    task = thread()
    started = client.runs.start_attempts(
        thread_id=task, definition_id="py-attempts", count=2,
        command=["sh", "-c", 'echo "mine $SANDHOLD_ATTEMPT" > "attempt-$SANDHOLD_ATTEMPT.txt"'],
    )
    assert len(started.attempts) == 2
    for attempt in started.attempts:
        assert list(client.runs.stream(attempt.run_id))[-1].type is ChunkType.RUN_FINISHED
    deadline = time.monotonic() + 120
    while True:
        evaluated = client.runs.attempt_set(started.attempt_set_id)
        if all(a.evaluated for a in evaluated.attempts) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    files = {a.attempt: [f.path for f in a.files] for a in evaluated.attempts}
    assert files == {0: ["attempt-0.txt"], 1: ["attempt-1.txt"]}
    winner = evaluated.attempts[1]
    assert "+mine 1" in client.runs.attempt_patch(started.attempt_set_id, winner.run_id)
    promoted = client.runs.promote_attempt(started.attempt_set_id, winner.run_id)
    assert promoted.set.promoted_run_id == winner.run_id
    after = client.runs.start(thread_id=task, command=["sh", "-c", "ls attempt-*.txt"])
    assert "".join(c.text for c in after) == "attempt-1.txt\n"
