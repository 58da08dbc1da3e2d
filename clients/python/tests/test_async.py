"""The asyncio client: the same API awaited, run streams resumed after
dropped connections, errors by reason; and the trace context each call
carries."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import support
from sandhold import AsyncSandhold, ChunkType, NotFound, definition


def test_the_asyncio_client(server: support.Server, local_definition: str) -> None:
    async def scenario() -> None:
        proxy = support.Proxy([server.port])
        try:
            async with AsyncSandhold(proxy.address, token=server.token) as client:
                assert (await client.server_info()).tenant == support.TENANT
                run = client.runs.start(thread_id=f"py-{uuid.uuid4().hex[:8]}", definition_id=local_definition,
                                        command=support.numbered_lines(20, 0.05))
                text, offsets = "", []
                async for chunk in run:
                    offsets.append(chunk.offset)
                    text += chunk.text
                    if proxy.cuts == 0 and "line-5\n" in text:
                        proxy.cut()
                assert text.split() == [f"line-{i}" for i in range(1, 21)]
                assert len(set(offsets)) == len(offsets) and run.completed and proxy.cuts == 1
                replay = [c.offset async for c in client.runs.stream(run.run_id)]
                assert replay == offsets

                box = (await client.sandboxes.ensure(local_definition, f"py-{uuid.uuid4().hex[:8]}")).sandbox_id
                await client.files.write(box, "a.txt", b"async")
                assert (await client.sandboxes.exec(box, "cat a.txt")).stdout == b"async"
                process = await client.sandboxes.exec_stream(box, "echo streamed")
                assert [o.data async for o in process] == [b"streamed\n"] and process.exit_code == 0
                terminal = await client.terminals.open(box, ["sh", "-c", "echo on-a-tty; exit 2"])
                assert b"on-a-tty" in b"".join([b async for b in terminal]) and terminal.exit_code == 2
                with pytest.raises(NotFound):
                    await client.runs.get("no-such-run")
        finally:
            proxy.close()

    asyncio.run(scenario())


def test_calls_carry_the_current_trace_context(server: support.Server) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from sandhold._connection import call_metadata

    tracer = TracerProvider().get_tracer("sandhold-test")
    assert [k for k, _ in call_metadata("t")] == ["authorization"]  # no span, no traceparent
    with tracer.start_as_current_span("client call") as span:
        metadata = dict(call_metadata("t"))
        context = span.get_span_context()
        assert metadata["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        with server.client() as client:  # the server takes a call that carries it
            client.definitions.put(definition("py-traced", local=True))
    assert trace.get_current_span() is trace.INVALID_SPAN
