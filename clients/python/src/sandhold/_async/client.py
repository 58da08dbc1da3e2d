"""The client: one connection to a server and the API by area."""

from __future__ import annotations

import os
from types import TracebackType

import grpc

from sandhold._async._transport import close_channel, open_channel
from sandhold._async.rpc import AsyncRpc
from sandhold._async.runs import AsyncRequests, AsyncRuns
from sandhold._async.sandboxes import AsyncDefinitions, AsyncFiles, AsyncGit, AsyncSandboxes
from sandhold._async.snapshots import AsyncSnapshots
from sandhold._async.streams import AsyncPorts, AsyncTerminals
from sandhold._connection import resolve_target, resolve_token
from sandhold._resume import Backoff
from sandhold.models import ServerInfo
from sandhold.v1 import admin_pb2, node_pb2


class AsyncSandhold:
    """A client of a Sandhold server.

    ``server``: ``HOST:PORT``, ``http://HOST:PORT``, ``https://HOST:PORT``
    (TLS, checked against ``ca_cert`` or ``SANDHOLD_CA_CERT``, else the
    system's roots; ``credentials`` for anything else, e.g. a client
    certificate) or ``unix:PATH``; default ``SANDHOLD_SERVER``, else the
    background server's socket when it runs, else ``127.0.0.1:7443``.
    ``token``: default ``SANDHOLD_TOKEN``, else, for a server on this
    machine, the ``local-token`` of ``data_dir`` (``SANDHOLD_DATA_DIR``,
    ``~/.local/share/sandhold``). ``timeout``: seconds of each unary call
    (None: none). ``backoff``: how run streams resume.

    The API by area: ``definitions``, ``sandboxes``, ``files``, ``git``,
    ``runs``, ``requests``, ``snapshots``, ``ports``, ``terminals``. The
    generated stubs are ``raw.runs``, ``raw.sandboxes``, ``raw.snapshots``,
    ``raw.admin`` (with ``raw.metadata()`` for their calls).
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        ca_cert: str | os.PathLike[str] | bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        backoff: Backoff | None = None,
        channel_options: list[tuple[str, int | str]] | None = None,
    ) -> None:
        target = resolve_target(server, ca_cert=ca_cert, credentials=credentials, options=channel_options)
        self.target = target.address
        self.raw = AsyncRpc(open_channel(target), resolve_token(token, target, data_dir), timeout)
        self.definitions = AsyncDefinitions(self.raw)
        self.sandboxes = AsyncSandboxes(self.raw)
        self.files = AsyncFiles(self.raw)
        self.git = AsyncGit(self.raw)
        self.runs = AsyncRuns(self.raw, backoff or Backoff())
        self.requests = AsyncRequests(self.raw, self.runs)
        self.snapshots = AsyncSnapshots(self.raw)
        self.ports = AsyncPorts(self.raw)
        self.terminals = AsyncTerminals(self.raw)

    async def server_info(self) -> ServerInfo:
        """Who the caller is (its tenant) and what the server is."""
        r = await self.raw.unary(self.raw.admin.GetServerInfo, admin_pb2.GetServerInfoRequest(), admin_pb2.GetServerInfoResponse)
        return ServerInfo.of(r)

    async def sweep(self) -> admin_pb2.SweepResponse:
        """Run the reaper's sweep now (the operator's tenant: every tenant; else the caller's)."""
        return await self.raw.unary(self.raw.admin.Sweep, admin_pb2.SweepRequest(), admin_pb2.SweepResponse)

    async def list_nodes(self) -> list[node_pb2.Node]:
        """The fleet's nodes (an operator tenant, or the single user)."""
        r = await self.raw.unary(self.raw.admin.ListNodes, node_pb2.ListNodesRequest(), node_pb2.ListNodesResponse)
        return list(r.nodes)

    async def drain_node(self, name: str) -> node_pb2.Node:
        """Give node `name` no new sandbox; its sandboxes and runs go on."""
        r = await self.raw.unary(self.raw.admin.DrainNode, node_pb2.DrainNodeRequest(name=name), node_pb2.DrainNodeResponse)
        return r.node

    async def remove_node(self, name: str) -> None:
        """Forget node `name`: its runs end SANDBOX_LOST and it may not register again."""
        await self.raw.unary(self.raw.admin.RemoveNode, node_pb2.RemoveNodeRequest(name=name), node_pb2.RemoveNodeResponse)

    async def close(self) -> None:
        await close_channel(self.raw.channel)

    async def __aenter__(self) -> AsyncSandhold:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
