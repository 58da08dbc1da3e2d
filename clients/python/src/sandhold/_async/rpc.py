"""One connection to a server: its channel, the generated stubs, the
metadata of each call, and calls whose failures are SandholdErrors."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, TypeVar, cast

import grpc

from sandhold._async._transport import Channel, Duplex
from sandhold._connection import call_metadata
from sandhold.errors import from_rpc_error
from sandhold.v1 import admin_pb2_grpc, run_pb2_grpc, sandbox_pb2_grpc, snapshot_pb2_grpc

R = TypeVar("R")


class AsyncRpc:
    """The generated stubs of a channel (``raw`` protobuf access: each
    stub's methods take and return the generated messages)."""

    def __init__(self, channel: Channel, token: str | None, timeout: float | None) -> None:
        self.channel = channel
        self.token = token
        self.timeout = timeout
        self.sandboxes = sandbox_pb2_grpc.SandboxServiceStub(channel)
        self.runs = run_pb2_grpc.RunServiceStub(channel)
        self.snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)

    def metadata(self) -> list[tuple[str, str]]:
        """Per call: the token and the current trace context."""
        return call_metadata(self.token)

    async def unary(self, method: Any, request: Any, response: type[R], timeout: float | None = None) -> R:
        try:
            result = await method(request, metadata=self.metadata(), timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return cast(R, result)

    async def stream(self, method: Any, request: Any, response: type[R]) -> AsyncGenerator[R, None]:
        """A server stream; the call is cancelled when the generator is closed."""
        call = method(request, metadata=self.metadata())
        try:
            async for item in call:
                yield cast(R, item)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    def duplex(self, method: Any) -> Duplex[Any, Any]:
        return Duplex(method, self.metadata())
