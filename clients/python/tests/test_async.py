"""The asyncio client: the same API awaited, run streams resumed after
dropped connections, errors by reason; and the trace context each call
carries."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import support
from sandhold import AsyncSandhold, Chunk, NotFound, Policy, Rule, Sandhold


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

                # A coroutine answers a permission request.
                asking = client.runs.start(
                    thread_id=f"py-{uuid.uuid4().hex[:8]}", definition_id=local_definition, harness="acp",
                    prompt="go", policy=Policy(default="allow", rules=[Rule("command", "*", "ask")]),
                    command=["python3", str(support.REPO / "tests" / "fake-acp" / "fake_acp_agent.py"),
                             "--log", "/dev/null", "--ask", "echo hi > asked.txt"])
                await asking.__anext__()
                await asking.close()

                async def decide(chunk: Chunk) -> bool:
                    await asyncio.sleep(0)
                    return True

                answers = await client.requests.handle(asking.run_id, permission=decide)
                assert [(a.kind, a.allowed) for a in answers] == [("permission", True)]
        finally:
            proxy.close()

    asyncio.run(scenario())


def test_calls_carry_the_current_trace_context() -> None:
    """What reaches a server: a gRPC server in this process stands in for
    Sandhold and records each call's metadata."""
    from concurrent import futures

    import grpc
    from opentelemetry.sdk.trace import TracerProvider

    from sandhold.v1 import admin_pb2, admin_pb2_grpc

    seen: list[dict[str, str]] = []

    class Admin(admin_pb2_grpc.AdminServiceServicer):  # type: ignore[misc]
        def GetServerInfo(self, request: object, context: grpc.ServicerContext) -> admin_pb2.GetServerInfoResponse:
            seen.append({k: str(v) for k, v in context.invocation_metadata()})
            return admin_pb2.GetServerInfoResponse(tenant="traced")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    admin_pb2_grpc.add_AdminServiceServicer_to_server(Admin(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tracer = TracerProvider().get_tracer("sandhold-test")
        with Sandhold(f"127.0.0.1:{port}", token="t") as client:
            client.server_info()  # no span: no traceparent
            with tracer.start_as_current_span("client call") as span:
                assert client.server_info().tenant == "traced"
                context = span.get_span_context()
    finally:
        server.stop(None)
    assert "traceparent" not in seen[0] and seen[0]["authorization"] == "Bearer t"
    want = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert seen[1]["traceparent"] == want
