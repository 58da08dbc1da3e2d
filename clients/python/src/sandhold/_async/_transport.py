"""The asyncio transport: channels, sleeping, two-way calls. (Written by
hand for each flavour; _sync/_transport.py is the blocking one.)"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar, Union

import grpc
import grpc.aio

from sandhold._connection import Target
from sandhold.chunks import Chunk
from sandhold.errors import from_rpc_error

Channel = grpc.aio.Channel
Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")

#: A permission handler: the PERMISSION_REQUESTED chunk (``tool_name``,
#: ``request.input``) -> allow, or (allow, message); a coroutine function too.
PermissionHandler = Callable[[Chunk], Union[bool, tuple[bool, str], Awaitable[Union[bool, tuple[bool, str]]]]]
#: A client tool: its input (parsed JSON) -> its result text; a coroutine function too.
ClientToolFn = Callable[[Any], Union[str, Awaitable[str]]]


async def resolve(value: T | Awaitable[T]) -> T:
    """A handler's answer, awaited when it is a coroutine's."""
    if inspect.isawaitable(value):
        return await value
    return value


def open_channel(target: Target) -> Channel:
    if target.credentials is None:
        return grpc.aio.insecure_channel(target.address, options=target.options)
    return grpc.aio.secure_channel(target.address, target.credentials, options=target.options)


async def close_channel(channel: Channel) -> None:
    await channel.close()


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


class Duplex(Generic[Req, Resp]):
    """A two-way call: requests sent one by one, responses iterated;
    failures as SandholdError."""

    def __init__(self, multicallable: Any, metadata: list[tuple[str, str]]) -> None:
        self._call: grpc.aio.StreamStreamCall[Req, Resp] = multicallable(metadata=metadata)

    async def send(self, request: Req) -> None:
        try:
            await self._call.write(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def done_sending(self) -> None:
        await self._call.done_writing()

    async def responses(self) -> AsyncIterator[Resp]:
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    return
                yield response  # type: ignore[misc]
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()
