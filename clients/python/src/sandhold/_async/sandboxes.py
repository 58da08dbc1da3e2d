"""Definitions, sandboxes (ensure, exec, environment), their files and
their git."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence

from sandhold._async.rpc import AsyncRpc
from sandhold._async.streams import AsyncFileWatch, AsyncProcess
from sandhold.chunks import Progress
from sandhold.models import ExecResult, FileInfo, Ready, Sandbox, command
from sandhold.v1 import sandbox_pb2 as pb

# WriteFile's data messages.
_WRITE_CHUNK = 1 << 20


class AsyncDefinitions:
    """``client.definitions``: sandbox definitions, stored per tenant
    (build one with :func:`sandhold.definition`)."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def put(self, definition: pb.SandboxDefinition) -> pb.SandboxDefinition:
        """Store (or replace) a definition; returns it as stored."""
        request = pb.PutDefinitionRequest(definition=definition)
        return (await self._rpc.unary(self._rpc.sandboxes.PutDefinition, request, pb.PutDefinitionResponse)).definition

    async def get(self, id: str = "", *, thread_id: str = "") -> pb.SandboxDefinition:
        """A definition by id, or the one a thread uses."""
        request = pb.GetDefinitionRequest(id=id, thread_id=thread_id)
        return (await self._rpc.unary(self._rpc.sandboxes.GetDefinition, request, pb.GetDefinitionResponse)).definition

    async def list(self) -> builtins.list[pb.SandboxDefinition]:
        r = await self._rpc.unary(self._rpc.sandboxes.ListDefinitions, pb.ListDefinitionsRequest(), pb.ListDefinitionsResponse)
        return builtins.list(r.definitions)

    async def delete(self, id: str) -> None:
        await self._rpc.unary(self._rpc.sandboxes.DeleteDefinition, pb.DeleteDefinitionRequest(id=id), pb.DeleteDefinitionResponse)


class AsyncSandboxes:
    """``client.sandboxes``: a thread's sandboxes, and commands in them."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def ensure(
        self,
        definition_id: str,
        thread_id: str,
        *,
        secrets: Mapping[str, str] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> Ready:
        """The thread's sandbox of a definition: resumed, restored from a
        snapshot, or created (its setup steps run, each reported through
        ``on_progress``)."""
        request = pb.EnsureSandboxRequest(definition_id=definition_id, thread_id=thread_id, secrets=dict(secrets or {}))
        async for event in self._rpc.stream(self._rpc.sandboxes.EnsureSandbox, request, pb.EnsureSandboxResponse):
            if event.HasField("progress") and on_progress is not None:
                on_progress(Progress.of(event.progress))
            elif event.HasField("ready"):
                return Ready.of(event.ready)
        raise RuntimeError("EnsureSandbox ended without its sandbox")

    async def get(self, sandbox_id: str) -> Sandbox:
        request = pb.GetSandboxRequest(sandbox_id=sandbox_id)
        return Sandbox.of((await self._rpc.unary(self._rpc.sandboxes.GetSandbox, request, pb.GetSandboxResponse)).sandbox)

    async def list(self, *, thread_id: str = "", with_state: bool = False) -> builtins.list[Sandbox]:
        """The tenant's sandboxes (of one thread); ``with_state`` asks each
        provider whether it still runs."""
        request = pb.ListSandboxesRequest(thread_id=thread_id, with_state=with_state)
        r = await self._rpc.unary(self._rpc.sandboxes.ListSandboxes, request, pb.ListSandboxesResponse)
        return [Sandbox.of(s) for s in r.sandboxes]

    async def destroy(self, sandbox_id: str) -> None:
        request = pb.DestroySandboxRequest(sandbox_id=sandbox_id)
        await self._rpc.unary(self._rpc.sandboxes.DestroySandbox, request, pb.DestroySandboxResponse)

    async def set_env(
        self, sandbox_id: str, set: Mapping[str, str] | None = None, unset: Sequence[str] = ()
    ) -> Sandbox:
        """Change the environment of the sandbox's later commands and runs."""
        request = pb.SetEnvRequest(sandbox_id=sandbox_id, set=dict(set or {}), unset=builtins.list(unset))
        return Sandbox.of((await self._rpc.unary(self._rpc.sandboxes.SetEnv, request, pb.SetEnvResponse)).sandbox)

    async def exec(
        self,
        sandbox_id: str,
        cmd: str | Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout_ms: int | None = None,
        output_limit_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command (a shell line, or an argv) to its end; its exit and output."""
        request = pb.ExecRequest(
            sandbox_id=sandbox_id,
            command=command(cmd),
            cwd=cwd,
            env=dict(env or {}),
            secrets=dict(secrets or {}),
            stdin=stdin,
            timeout_ms=timeout_ms,
            output_limit_bytes=output_limit_bytes,
        )
        return ExecResult.of(await self._rpc.unary(self._rpc.sandboxes.Exec, request, pb.ExecResponse))

    async def exec_stream(
        self,
        sandbox_id: str,
        cmd: str | Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> AsyncProcess:
        """Start a command and talk to it: write its stdin, signal it, read
        its output as it comes (see :class:`AsyncProcess`)."""
        start = pb.ExecStreamStart(
            sandbox_id=sandbox_id, command=command(cmd), cwd=cwd, env=dict(env or {}), secrets=dict(secrets or {})
        )
        process = AsyncProcess(self._rpc.duplex(self._rpc.sandboxes.ExecStream))
        await process._duplex.send(pb.ExecStreamRequest(start=start))
        return process


class AsyncFiles:
    """``client.files``: the files of a sandbox (paths relative to its root)."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def read(self, sandbox_id: str, path: str, *, offset: int = 0, limit: int = 0) -> bytes:
        """A file's bytes (from ``offset``, at most ``limit``; 0: all)."""
        request = pb.ReadFileRequest(sandbox_id=sandbox_id, path=path, offset=offset, limit=limit)
        parts = [r.data async for r in self._rpc.stream(self._rpc.sandboxes.ReadFile, request, pb.ReadFileResponse)]
        return b"".join(parts)

    async def read_text(self, sandbox_id: str, path: str) -> str:
        return (await self.read(sandbox_id, path)).decode()

    async def write(
        self,
        sandbox_id: str,
        path: str,
        data: bytes | str,
        *,
        mode: int | None = None,
        make_parents: bool = False,
    ) -> int:
        """Write a whole file (replacing it); the bytes written."""
        body = data.encode() if isinstance(data, str) else data
        header = pb.WriteFileHeader(sandbox_id=sandbox_id, path=path, mode=mode, make_parents=make_parents, size=len(body))
        requests = [pb.WriteFileRequest(header=header)]
        requests += [pb.WriteFileRequest(data=body[i : i + _WRITE_CHUNK]) for i in range(0, len(body), _WRITE_CHUNK)]
        r = await self._rpc.unary(self._rpc.sandboxes.WriteFile, iter(requests), pb.WriteFileResponse)
        return r.bytes_written

    async def list(self, sandbox_id: str, path: str = "", *, depth: int = 0) -> builtins.list[FileInfo]:
        """A directory's entries (``depth`` levels below it; 0: one)."""
        request = pb.ListFilesRequest(sandbox_id=sandbox_id, path=path, depth=depth)
        r = await self._rpc.unary(self._rpc.sandboxes.ListFiles, request, pb.ListFilesResponse)
        return [FileInfo.of(e) for e in r.entries]

    async def stat(self, sandbox_id: str, path: str, *, no_follow: bool = False) -> FileInfo:
        request = pb.StatFileRequest(sandbox_id=sandbox_id, path=path, no_follow=no_follow)
        return FileInfo.of((await self._rpc.unary(self._rpc.sandboxes.StatFile, request, pb.StatFileResponse)).info)

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool = False) -> None:
        request = pb.MakeDirRequest(sandbox_id=sandbox_id, path=path, parents=parents)
        await self._rpc.unary(self._rpc.sandboxes.MakeDir, request, pb.MakeDirResponse)

    async def remove(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        request = pb.RemoveFileRequest(sandbox_id=sandbox_id, path=path, recursive=recursive)
        await self._rpc.unary(self._rpc.sandboxes.RemoveFile, request, pb.RemoveFileResponse)

    async def rename(self, sandbox_id: str, source: str, target: str) -> None:
        request = pb.RenameFileRequest(sandbox_id=sandbox_id, to=target, **{"from": source})
        await self._rpc.unary(self._rpc.sandboxes.RenameFile, request, pb.RenameFileResponse)

    async def watch(
        self, sandbox_id: str, path: str = "", *, recursive: bool = True, ignore: Sequence[str] = ()
    ) -> AsyncFileWatch:
        """Watch a path: returns once the watch is in place; iterate the
        returned watch for its events, ``close()`` it to stop."""
        request = pb.WatchFilesRequest(sandbox_id=sandbox_id, path=path, recursive=recursive, ignore=builtins.list(ignore))
        events = self._rpc.stream(self._rpc.sandboxes.WatchFiles, request, pb.WatchFilesResponse)
        watch = AsyncFileWatch(events)
        await watch._started()
        return watch


class AsyncGit:
    """``client.git``: git in a sandbox's workspace (``path``: a repository
    below the root; default the root). Answers are the generated messages."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def status(self, sandbox_id: str, *, path: str = "") -> pb.GitStatusResponse:
        request = pb.GitStatusRequest(sandbox_id=sandbox_id, path=path)
        return await self._rpc.unary(self._rpc.sandboxes.GitStatus, request, pb.GitStatusResponse)

    async def diff(
        self, sandbox_id: str, *, path: str = "", base: str = "", staged: bool = False, paths: Sequence[str] = ()
    ) -> pb.GitDiffResponse:
        request = pb.GitDiffRequest(sandbox_id=sandbox_id, path=path, base=base, staged=staged, paths=builtins.list(paths))
        return await self._rpc.unary(self._rpc.sandboxes.GitDiff, request, pb.GitDiffResponse)

    async def add(self, sandbox_id: str, paths: Sequence[str] = (), *, path: str = "") -> pb.GitStatusResponse:
        """Stage ``paths`` (none: everything); the status after."""
        request = pb.GitAddRequest(sandbox_id=sandbox_id, path=path, paths=builtins.list(paths))
        return (await self._rpc.unary(self._rpc.sandboxes.GitAdd, request, pb.GitAddResponse)).status

    async def commit(
        self,
        sandbox_id: str,
        message: str,
        *,
        path: str = "",
        author_name: str = "",
        author_email: str = "",
        all: bool = False,
        allow_empty: bool = False,
    ) -> pb.GitCommitResponse:
        request = pb.GitCommitRequest(
            sandbox_id=sandbox_id,
            path=path,
            message=message,
            author=pb.GitAuthor(name=author_name, email=author_email),
            all=all,
            allow_empty=allow_empty,
        )
        return await self._rpc.unary(self._rpc.sandboxes.GitCommit, request, pb.GitCommitResponse)

    async def branch(
        self, sandbox_id: str, name: str = "", *, create: bool = False, start_point: str = "", path: str = ""
    ) -> pb.GitBranchResponse:
        """Switch to branch ``name`` (``create``: a new one); none: the current one."""
        request = pb.GitBranchRequest(sandbox_id=sandbox_id, path=path, name=name, create=create, start_point=start_point)
        return await self._rpc.unary(self._rpc.sandboxes.GitBranch, request, pb.GitBranchResponse)

    async def push(
        self,
        sandbox_id: str,
        *,
        remote: str = "",
        branch: str = "",
        force: bool = False,
        secrets: Mapping[str, str] | None = None,
        path: str = "",
    ) -> pb.GitPushResponse:
        request = pb.GitPushRequest(
            sandbox_id=sandbox_id, path=path, remote=remote, branch=branch, force=force, secrets=dict(secrets or {})
        )
        return await self._rpc.unary(self._rpc.sandboxes.GitPush, request, pb.GitPushResponse)

    async def pull(
        self,
        sandbox_id: str,
        *,
        remote: str = "",
        branch: str = "",
        secrets: Mapping[str, str] | None = None,
        path: str = "",
    ) -> pb.GitPullResponse:
        request = pb.GitPullRequest(sandbox_id=sandbox_id, path=path, remote=remote, branch=branch, secrets=dict(secrets or {}))
        return await self._rpc.unary(self._rpc.sandboxes.GitPull, request, pb.GitPullResponse)
