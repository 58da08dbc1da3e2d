"""A run stream survives the death of the server replica serving it: two
replicas on one PostgreSQL database and Redis behind one address (a TCP
proxy); the one driving the run is killed (SIGKILL) mid-run; the stream
goes on through the other, which takes the run over, and every chunk
arrives once, in order."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import support
from sandhold import ChunkType, Reconnect, Sandhold, definition


@pytest.fixture()
def replicas() -> Iterator[tuple[support.Server, support.Server]]:
    postgres = support.service_url("SANDHOLD_TEST_DATABASE_URL", "PostgreSQL")
    redis = support.service_url("SANDHOLD_TEST_REDIS_URL", "Redis")
    token = f"py-token-{uuid.uuid4().hex[:12]}"
    with support.scratch_dir() as root, support.scratch_database(postgres) as database:
        started: list[support.Server] = []
        try:
            for name in ("a", "b"):
                started.append(support.Server(root / "data", token, args=(
                    "--database-url", database, "--redis-url", redis, "--replica-id", f"py-{name}",
                    "--lease-ttl-ms", "2000", "--lease-renew-ms", "500")))
            yield started[0], started[1]
        finally:
            for s in started:
                s.stop()


def test_a_stream_survives_the_death_of_its_replica(replicas: tuple[support.Server, support.Server]) -> None:
    a, b = replicas
    proxy = support.Proxy([a.port, b.port])  # A while it lives, then B
    reconnects: list[Reconnect] = []
    try:
        with Sandhold(proxy.address, token=a.token) as client:
            assert client.server_info().replica_id == "py-a"
            client.definitions.put(definition("py-replicas", local=True))
            run = client.runs.start(thread_id=f"py-{uuid.uuid4().hex[:8]}", definition_id="py-replicas",
                                    command=support.numbered_lines(30, 0.1), on_reconnect=reconnects.append)
            text, offsets, types = "", [], []
            for chunk in run:
                offsets.append(chunk.offset)
                types.append(chunk.type)
                text += chunk.text
                if a.proc.poll() is None and "line-8\n" in text:
                    a.kill()
            assert client.server_info().replica_id == "py-b"
    finally:
        proxy.close()
    assert a.proc.returncode is not None, "replica A was never killed"
    assert reconnects, "the stream never had to resume"
    assert text.split() == [f"line-{i}" for i in range(1, 31)]
    assert len(set(offsets)) == len(offsets), "an offset was delivered twice"
    assert types.count(ChunkType.RUN_STARTED) == 1 and types[-1] is ChunkType.RUN_FINISHED
    assert run.completed
    with b.client() as client:
        assert [c.offset for c in client.runs.stream(run.run_id)] == offsets
