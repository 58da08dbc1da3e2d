"""Every method of the client once, against a real server (local sandboxes):
definitions, sandboxes, exec, files, watch, git, ports, terminals,
snapshots, admin; and errors by reason."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

import support
from sandhold import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RunStatus,
    Sandhold,
    SandholdError,
    TransportError,
    Unauthenticated,
    Unsupported,
    definition,
)
from sandhold.v1 import admin_pb2, run_pb2


def ensure(client: Sandhold, definition_id: str) -> str:
    return client.sandboxes.ensure(definition_id, f"py-{uuid.uuid4().hex[:10]}").sandbox_id


def test_definitions(client: Sandhold) -> None:
    stored = client.definitions.put(definition("py-defs", local=True, setup=["true", ["true", "true"]], env={"A": "1"}))
    assert stored.id == "py-defs" and stored.env["A"] == "1"
    assert client.definitions.get("py-defs").workspace.setup[1].parallel.commands == ["true", "true"]
    assert "py-defs" in [d.id for d in client.definitions.list()]
    client.definitions.delete("py-defs")
    with pytest.raises(NotFound):
        client.definitions.get("py-defs")


def test_sandboxes_and_exec(client: Sandhold, local_definition: str) -> None:
    thread = f"py-{uuid.uuid4().hex[:10]}"
    progress: list[str] = []
    ready = client.sandboxes.ensure(local_definition, thread, on_progress=lambda p: progress.append(p.phase))
    assert ready.outcome == "CREATED" and "SETUP" in progress
    again = client.sandboxes.ensure(local_definition, thread)
    assert again.outcome == "RESUMED" and again.sandbox_id == ready.sandbox_id
    box = client.sandboxes.get(ready.sandbox_id)
    assert box.thread_id == thread and box.provider == "local"
    listed = client.sandboxes.list(thread_id=thread, with_state=True)
    assert [s.sandbox_id for s in listed] == [ready.sandbox_id] and listed[0].state == "RUNNING"
    assert client.sandboxes.set_env(ready.sandbox_id, {"GREETING": "hello"}).env["GREETING"] == "hello"

    result = client.sandboxes.exec(ready.sandbox_id, 'echo "$GREETING"; cat made.txt; echo err >&2; exit 3')
    assert (result.exit_code, result.text, result.stderr) == (3, "hello\nmade\n", b"err\n")
    assert client.sandboxes.exec(ready.sandbox_id, ["cat"], stdin=b"in").stdout == b"in"

    process = client.sandboxes.exec_stream(ready.sandbox_id, ["sh", "-c", "read x; echo got $x; echo oops >&2"])
    process.write(b"it\n")
    process.close_stdin()
    outputs = list(process)
    assert process.exit_code == 0 and process.pid > 0
    assert b"".join(o.data for o in outputs if o.stream == "stdout") == b"got it\n"
    assert b"".join(o.data for o in outputs if o.stream == "stderr") == b"oops\n"

    sleeper = client.sandboxes.exec_stream(ready.sandbox_id, ["sleep", "600"])
    sleeper.kill(9)
    assert sleeper.wait() is None and sleeper.signal == 9

    client.sandboxes.destroy(ready.sandbox_id)
    with pytest.raises(NotFound):
        client.sandboxes.get(ready.sandbox_id)


def test_files_and_watch(client: Sandhold, local_definition: str) -> None:
    box = ensure(client, local_definition)
    client.files.mkdir(box, "w")
    watch = client.files.watch(box, "w")
    assert client.files.write(box, "w/a.txt", "hello", make_parents=True) == 5
    assert client.files.read(box, "w/a.txt") == b"hello"
    assert client.files.read(box, "w/a.txt", offset=1, limit=3) == b"ell"
    assert client.files.read_text(box, "w/a.txt") == "hello"
    client.files.mkdir(box, "w/d/e", parents=True)
    client.files.rename(box, "w/a.txt", "w/d/b.txt")
    info = client.files.stat(box, "w/d/b.txt")
    assert (info.type, info.size, info.name) == ("FILE", 5, "b.txt")
    assert sorted(f.name for f in client.files.list(box, "w/d")) == ["b.txt", "e"]
    client.files.remove(box, "w/d", recursive=True)
    with pytest.raises(NotFound):
        client.files.stat(box, "w/d")
    seen = []
    for event in watch:
        seen.append((event.type, event.path))
        if event.type == "DELETE" or len(seen) > 20:
            break
    watch.close()
    assert any(path.endswith("a.txt") for _, path in seen), seen


def test_git(client: Sandhold, local_definition: str) -> None:
    box = ensure(client, local_definition)
    setup = client.sandboxes.exec(box, "git init -q -b main . && git init -q --bare remote.git && "
                                       "git remote add origin \"$PWD/remote.git\" && echo remote.git > .gitignore")
    assert setup.ok, setup.stderr
    client.files.write(box, "a.txt", "one\n")
    status = client.git.add(box, ["a.txt", ".gitignore"])
    assert {f.path for f in status.files} >= {"a.txt"}
    commit = client.git.commit(box, "first", author_name="Py", author_email="py@example.invalid")
    assert commit.branch == "main" and len(commit.commit) == 40
    client.files.write(box, "a.txt", "two\n")
    diff = client.git.diff(box)
    assert "+two" in diff.diff and diff.files[0].path == "a.txt"
    assert client.git.status(box).branch == "main"
    assert client.git.branch(box, "feature", create=True).branch == "feature"
    pushed = client.git.push(box, remote="origin", branch="feature")
    assert pushed.commit == commit.commit
    pulled = client.git.pull(box, remote="origin", branch="feature")
    assert pulled.after == commit.commit


def test_ports(client: Sandhold, local_definition: str) -> None:
    with pytest.raises(Unsupported):  # local sandboxes have no ports of their own
        client.ports.connect(ensure(client, local_definition), 8000)
    client.definitions.put(definition("py-docker", image=support.docker_image()))
    box = ensure(client, "py-docker")
    port = 8000
    server = client.sandboxes.exec_stream(box, ["python3", "-c", (
        "import socket; s=socket.create_server(('127.0.0.1', %d)); print('up', flush=True); c,_=s.accept(); "
        "c.sendall(c.recv(100).upper()); c.close()") % port])
    next(iter(server))  # "up": listening
    connection = client.ports.connect(box, port)
    connection.send(b"ping")
    connection.close()  # our side; the answer still comes
    assert b"".join(connection) == b"PING"
    assert server.wait() == 0


def test_terminals(client: Sandhold, local_definition: str) -> None:
    box = ensure(client, local_definition)
    terminal = client.terminals.open(box, ["sh"], rows=30, cols=100)
    terminal.write("stty size\n")
    screen = b""
    output = iter(terminal)
    while b"30 100" not in screen:
        screen += next(output)
    terminal.resize(40, 120)
    terminal.write("stty size; exit 7\n")
    screen = b"".join(output)
    assert b"40 120" in screen
    assert terminal.exit_code == 7
    sleeper = client.terminals.open(box, ["sleep", "600"])
    sleeper.kill(9)
    assert b"".join(sleeper) == b"" and sleeper.signal == 9


def test_snapshots(client: Sandhold) -> None:
    client.definitions.put(definition("py-snap", local=True, portable_snapshots=True))
    thread = f"py-{uuid.uuid4().hex[:10]}"
    run = client.runs.start(thread_id=thread, definition_id="py-snap", command=["sh", "-c", "echo kept > kept.txt"])
    assert run.text() == "" and run.completed
    # The run's end saves a checkpoint by itself ("after run"); one writer
    # per thread, so the next save waits for it.
    deadline = time.monotonic() + 30
    while not client.snapshots.list(thread) and time.monotonic() < deadline:
        time.sleep(0.1)
    checkpoint = client.snapshots.save(thread, label="mine")
    assert checkpoint.label == "mine" and checkpoint.file_count >= 1 and checkpoint.head
    assert [c.label for c in client.snapshots.list(thread)] == ["after run", "mine"]
    assert client.snapshots.read_artifact(thread, checkpoint.checkpoint_id, "kept.txt") == b"kept\n"
    fork = client.snapshots.fork(thread, checkpoint.checkpoint_id, thread + "-fork")
    assert fork.checkpoint.thread_id == thread + "-fork" and len(fork.run_ids) == 1
    again = client.runs.start(thread_id=thread + "-fork", command=["cat", "kept.txt"])
    assert again.text() == "kept\n"
    client.snapshots.delete(thread + "-fork", fork.checkpoint.checkpoint_id)


def test_admin_and_raw_stubs(client: Sandhold, server: support.Server) -> None:
    info = client.server_info()
    assert info.tenant == support.TENANT and info.store_backend
    assert isinstance(client.sweep(), admin_pb2.SweepResponse)
    # The generated stubs stay reachable, with the client's metadata.
    raw = client.raw.runs.ListRuns(run_pb2.ListRunsRequest(limit=1), metadata=client.raw.metadata())
    assert isinstance(raw, run_pb2.ListRunsResponse)


def test_errors_by_reason(client: Sandhold, server: support.Server, local_definition: str) -> None:
    with pytest.raises(NotFound) as e:
        list(client.runs.stream("no-such-run"))
    assert e.value.reason == "NOT_FOUND" and e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound):
        client.runs.cancel("no-such-run")
    with Sandhold(server.address, token="not-a-token") as stranger:
        with pytest.raises(Unauthenticated) as u:
            stranger.server_info()
        assert u.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(InvalidArgument):
        list(client.runs.start(thread_id="", command=["true"]))
    run = client.runs.start(thread_id=f"py-{uuid.uuid4().hex[:8]}", definition_id=local_definition, command=["true"])
    list(run)
    with pytest.raises(AlreadyExists) as a:
        list(client.runs.start(thread_id="x", run_id=run.run_id, definition_id=local_definition, command=["true"]))
    assert isinstance(a.value, SandholdError)
    # No server there: no Sandhold reason, a transport error.
    with Sandhold(f"127.0.0.1:{support.free_port()}", token="t", timeout=5) as nobody:
        with pytest.raises(TransportError) as t:
            nobody.server_info()
        assert t.value.code == grpc.StatusCode.UNAVAILABLE


def test_an_answer_to_an_ended_run_is_a_failed_precondition(client: Sandhold, local_definition: str) -> None:
    run = client.runs.start(thread_id=f"py-{uuid.uuid4().hex[:8]}", definition_id=local_definition, command=["true"])
    list(run)
    deadline = time.monotonic() + 30
    while client.runs.get(run.run_id).status is RunStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(FailedPrecondition) as e:
        client.requests.allow(run.run_id, "no-such-request")
    assert "has ended" in e.value.message and e.value.code == grpc.StatusCode.FAILED_PRECONDITION
