"""The blocking transport: channels, sleeping, two-way calls. (Written by
hand for each flavour; _async/_transport.py is the asyncio one.)"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, Union

import grpc

from sandhold._connection import Target
from sandhold.chunks import Chunk
from sandhold.errors import from_rpc_error

Channel = grpc.Channel
Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")

#: A permission handler: the PERMISSION_REQUESTED chunk (``tool_name``,
#: ``request.input``) -> allow, or (allow, message).
PermissionHandler = Callable[[Chunk], Union[bool, tuple[bool, str]]]
#: A client tool: its input (parsed JSON) -> its result text.
ClientToolFn = Callable[[Any], str]


def resolve(value: T) -> T:
    """A handler's answer (the asyncio client awaits coroutines' here)."""
    return value


def open_channel(target: Target) -> Channel:
    if target.credentials is None:
        return grpc.insecure_channel(target.address, options=target.options)
    return grpc.secure_channel(target.address, target.credentials, options=target.options)


def close_channel(channel: Channel) -> None:
    channel.close()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


_END = object()


class Duplex(Generic[Req, Resp]):
    """A two-way call: requests sent one by one (through a queue the call's
    request iterator reads), responses iterated; failures as SandholdError."""

    def __init__(self, multicallable: Any, metadata: list[tuple[str, str]]) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._call: Any = multicallable(iter(self._queue.get, _END), metadata=metadata)

    def send(self, request: Req) -> None:
        self._queue.put(request)

    def done_sending(self) -> None:
        self._queue.put(_END)

    def responses(self) -> Iterator[Resp]:
        try:
            yield from self._call
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()
        self._queue.put(_END)
