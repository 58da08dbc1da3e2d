"""Calls that stay open: a streamed command, a terminal, a port's byte
stream, a file watch."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandhold._async._transport import Duplex
from sandhold._async.rpc import AsyncRpc
from sandhold.models import FileEvent, command, exit_status
from sandhold.v1 import sandbox_pb2 as pb


@dataclass(frozen=True)
class Output:
    """Output of a streamed command: ``stream`` is "stdout" or "stderr"."""

    stream: str
    data: bytes


class _AsyncCommand:
    """A command's two-way call: its pid, then its output, then its exit
    (``exit_code``, or ``signal`` when a signal ended it)."""

    def __init__(self, duplex: Duplex[Any, Any]) -> None:
        self._duplex = duplex
        self._responses = duplex.responses()
        self.pid = 0
        self.exit_code: int | None = None
        self.signal: int | None = None

    async def _outputs(self) -> AsyncGenerator[Any, None]:
        """The ``output`` of each response; the pid and the exit recorded on the way."""
        async for r in self._responses:
            which = r.WhichOneof("event")
            if which == "started_pid":
                self.pid = r.started_pid
            elif which == "output":
                yield r.output
            elif which == "exited":
                self.exit_code, self.signal = exit_status(r.exited)
                await self._duplex.done_sending()

    def cancel(self) -> None:
        self._duplex.cancel()


class AsyncProcess(_AsyncCommand):
    """A command started by ``sandboxes.exec_stream``: iterate it for its
    :class:`Output`; ``exit_code`` / ``signal`` are set once it ended."""

    async def write(self, data: bytes) -> None:
        await self._duplex.send(pb.ExecStreamRequest(stdin=data))

    async def close_stdin(self) -> None:
        await self._duplex.send(pb.ExecStreamRequest(close_stdin=pb.CloseStdin()))

    async def kill(self, signal: int = 15) -> None:
        await self._duplex.send(pb.ExecStreamRequest(signal=signal))

    def __aiter__(self) -> AsyncIterator[Output]:
        return self._output()

    async def _output(self) -> AsyncGenerator[Output, None]:
        async for out in self._outputs():
            yield Output("stderr" if out.stream == pb.OUTPUT_STREAM_STDERR else "stdout", out.data)

    async def wait(self) -> int | None:
        """Read to the end; the exit code (None: ended by a signal)."""
        async for _ in self:
            pass
        return self.exit_code


class AsyncTerminal(_AsyncCommand):
    """A command on a PTY (``terminals.open``): write keys, resize, iterate
    its screen output as bytes; ``exit_code`` once it ended."""

    async def write(self, data: bytes | str) -> None:
        await self._duplex.send(pb.OpenTerminalRequest(input=data.encode() if isinstance(data, str) else data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._duplex.send(pb.OpenTerminalRequest(resize=pb.TerminalSize(rows=rows, cols=cols)))

    async def kill(self, signal: int = 15) -> None:
        await self._duplex.send(pb.OpenTerminalRequest(signal=signal))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._outputs()


class AsyncTerminals:
    """``client.terminals``: interactive commands on a pseudo-terminal."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def open(
        self,
        sandbox_id: str,
        cmd: str | Sequence[str] | None = None,
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        rows: int = 24,
        cols: int = 80,
        term: str = "",
    ) -> AsyncTerminal:
        """Start ``cmd`` (default: the sandbox's shell) on a PTY of ``rows`` x ``cols``."""
        start = pb.OpenTerminalStart(
            sandbox_id=sandbox_id,
            cwd=cwd,
            env=dict(env or {}),
            secrets=dict(secrets or {}),
            size=pb.TerminalSize(rows=rows, cols=cols),
            term=term,
        )
        if cmd is not None:
            start.command.CopyFrom(command(cmd))
        terminal = AsyncTerminal(self._rpc.duplex(self._rpc.sandboxes.OpenTerminal))
        await terminal._duplex.send(pb.OpenTerminalRequest(start=start))
        return terminal


class AsyncPortConnection:
    """A TCP connection to a port inside a sandbox, as a byte stream:
    ``send`` bytes, iterate what comes back; ``close()`` ends it."""

    def __init__(self, duplex: Duplex[Any, Any]) -> None:
        self._duplex = duplex
        self._responses = duplex.responses()

    async def _opened(self) -> None:
        async for r in self._responses:
            if r.WhichOneof("event") == "opened":
                return
        raise ConnectionError("the port's stream ended before it opened")

    async def send(self, data: bytes) -> None:
        await self._duplex.send(pb.ConnectPortRequest(data=data))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._data()

    async def _data(self) -> AsyncGenerator[bytes, None]:
        async for r in self._responses:
            if r.WhichOneof("event") == "data":
                yield r.data

    async def close(self) -> None:
        """Close our side; what the port still sends can be read."""
        await self._duplex.send(pb.ConnectPortRequest(close=pb.ConnectPortClose()))
        await self._duplex.done_sending()

    def cancel(self) -> None:
        self._duplex.cancel()


class AsyncPorts:
    """``client.ports``: reach a port a sandbox listens on."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def connect(self, sandbox_id: str, port: int) -> AsyncPortConnection:
        """Connect to ``port`` on the sandbox's loopback; returns once connected."""
        connection = AsyncPortConnection(self._rpc.duplex(self._rpc.sandboxes.ConnectPort))
        await connection._duplex.send(pb.ConnectPortRequest(open=pb.ConnectPortOpen(sandbox_id=sandbox_id, port=port)))
        await connection._opened()
        return connection


class AsyncFileWatch:
    """File events under a watched path: iterate it; ``close()`` stops it."""

    def __init__(self, responses: AsyncGenerator[pb.WatchFilesResponse, None]) -> None:
        self._responses = responses

    async def _started(self) -> None:
        first = await self._responses.__anext__()
        if first.WhichOneof("kind") != "started":
            raise RuntimeError("WatchFiles did not start with `started`")

    def __aiter__(self) -> AsyncFileWatch:
        return self

    async def __anext__(self) -> FileEvent:
        while True:
            r = await self._responses.__anext__()
            if r.WhichOneof("kind") == "event":
                return FileEvent.of(r.event)

    async def close(self) -> None:
        await self._responses.aclose()
