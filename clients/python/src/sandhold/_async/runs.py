"""Runs: start, stream (resuming by itself), get, list, cancel, delete; and
their requests (permissions under an ``ask`` rule, client tool calls)."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from sandhold._async._transport import ClientToolFn, PermissionHandler, resolve, sleep
from sandhold._async.rpc import AsyncRpc
from sandhold._error_base import SandholdError
from sandhold._resume import Backoff, Reconnect, resumable
from sandhold.chunks import Chunk, ChunkType, Progress
from sandhold.models import Policy, Run, RunRequest, RunStatus
from sandhold.v1 import run_pb2, sandbox_pb2

OnProgress = Callable[[Progress], None]
OnReconnect = Callable[[Reconnect], None]


class AsyncRunStream:
    """A run's chunks, in order, each once: iterate it. A dropped
    connection (or the death of the server replica serving it) is resumed
    after the last chunk delivered, with backoff; iteration ends after the
    run's terminal chunk. ``last_offset`` is the offset of the last chunk
    delivered (attach after it to continue elsewhere)."""

    def __init__(self, run_id: str, items: AsyncGenerator[Chunk, None], after_offset: str = "") -> None:
        self.run_id = run_id
        self.last_offset = after_offset
        #: The terminal chunk (RUN_FINISHED or RUN_ERROR), once delivered.
        self.terminal: Chunk | None = None
        self._items = items

    def __aiter__(self) -> AsyncRunStream:
        return self

    async def __anext__(self) -> Chunk:
        chunk = await self._items.__anext__()
        self.last_offset = chunk.offset
        if chunk.is_terminal:
            self.terminal = chunk
        return chunk

    @property
    def completed(self) -> bool:
        """Whether the run ended normally (its terminal chunk is RUN_FINISHED)."""
        return self.terminal is not None and self.terminal.type is ChunkType.RUN_FINISHED

    async def text(self) -> str:
        """Read the run to its end; the assistant text (for ``command``: what it printed)."""
        return "".join([chunk.text async for chunk in self])

    async def close(self) -> None:
        """Stop reading (the run goes on: a disconnect is never a cancel)."""
        await self._items.aclose()


class AsyncRuns:
    """``client.runs``."""

    def __init__(self, rpc: AsyncRpc, backoff: Backoff) -> None:
        self._rpc = rpc
        self._backoff = backoff

    def start(
        self,
        *,
        thread_id: str,
        harness: str | None = None,
        definition_id: str = "",
        command: Sequence[str] | None = None,
        prompt: str = "",
        durable: bool = True,
        run_id: str = "",
        options: run_pb2.HarnessOptions | None = None,
        policy: Policy | sandbox_pb2.SandboxPolicy | None = None,
        client_tools: Sequence[run_pb2.ClientTool] = (),
        secrets: Mapping[str, str] | None = None,
        cwd: str = "",
        new_session: bool = False,
        on_progress: OnProgress | None = None,
        on_reconnect: OnReconnect | None = None,
        request: run_pb2.StartRunRequest | None = None,
    ) -> AsyncRunStream:
        """Start a run and stream it. ``harness``: "command" (the default
        when ``command`` is given: its argv), "claude-code", "codex",
        "opencode", "gemini" or "acp"; ``options`` the harness's
        HarnessOptions; ``policy`` tightens the definition's. A durable run
        (the default) gets a run id when it has none, and its stream resumes
        after a dropped connection; a run that is not durable ends with its
        connection. ``request`` is a whole StartRunRequest instead (the
        other arguments but the callbacks are then ignored)."""
        if request is None:
            request = _run_request(thread_id, harness, definition_id, command, prompt, options, secrets)
            request.run_id = run_id
            request.durable = durable
            request.cwd = cwd
            request.new_session = new_session
            request.client_tools.extend(client_tools)
            if policy is not None:
                request.policy.CopyFrom(policy.to_proto() if isinstance(policy, Policy) else policy)
        if request.durable and not request.run_id:
            request.run_id = f"run-{uuid.uuid4().hex}"
        return AsyncRunStream(request.run_id, self._start(request, on_progress, on_reconnect))

    async def _start(
        self, request: run_pb2.StartRunRequest, on_progress: OnProgress | None, on_reconnect: OnReconnect | None
    ) -> AsyncGenerator[Chunk, None]:
        last = ""
        saw_chunk = False
        events = self._rpc.stream(self._rpc.runs.StartRun, request, run_pb2.RunEvent)
        try:
            async for event in events:
                if event.HasField("progress"):
                    if on_progress is not None:
                        on_progress(Progress.of(event.progress))
                    continue
                if not event.HasField("chunk"):
                    continue
                chunk = Chunk.of(event.chunk)
                last, saw_chunk = chunk.offset, True
                yield chunk
                if chunk.is_terminal:
                    return
            return
        except SandholdError as error:
            if not request.durable or not resumable(error):
                raise
            if on_reconnect is not None:
                on_reconnect(Reconnect(1, last, error))
        finally:
            await events.aclose()
        # The connection dropped: the run goes on (durable runs detach);
        # continue after the last chunk delivered.
        async for chunk in self._follow(request.run_id, last, "", on_reconnect, may_not_exist_yet=not saw_chunk):
            yield chunk

    def stream(
        self,
        run_id: str,
        *,
        after_offset: str = "",
        thread_id: str = "",
        on_reconnect: OnReconnect | None = None,
    ) -> AsyncRunStream:
        """Replay a run's log after ``after_offset`` (default: from the
        start), then follow it until the run ends; a dropped connection or a
        replica's death is resumed after the last chunk delivered, every
        chunk delivered once. ``thread_id``, when set, must be the run's."""
        items = self._follow(run_id, after_offset, thread_id, on_reconnect, may_not_exist_yet=False)
        return AsyncRunStream(run_id, items, after_offset)

    async def _follow(
        self,
        run_id: str,
        after: str,
        thread_id: str,
        on_reconnect: OnReconnect | None,
        *,
        may_not_exist_yet: bool,
    ) -> AsyncGenerator[Chunk, None]:
        attempt = 0
        delay = self._backoff.initial_delay
        while True:
            request = run_pb2.AttachRunRequest(run_id=run_id, after_offset=after, thread_id=thread_id)
            events = self._rpc.stream(self._rpc.runs.AttachRun, request, run_pb2.RunEvent)
            try:
                async for event in events:
                    if not event.HasField("chunk"):
                        continue
                    chunk = Chunk.of(event.chunk)
                    after = chunk.offset
                    attempt, delay = 0, self._backoff.initial_delay
                    yield chunk
                    if chunk.is_terminal:
                        return
                return
            except SandholdError as error:
                # A StartRun cut before the server recorded the run: its id
                # is not known yet, for a moment.
                early = may_not_exist_yet and after == "" and error.reason == "NOT_FOUND"
                if not resumable(error) and not early:
                    raise
                attempt += 1
                if self._backoff.max_attempts is not None and attempt > self._backoff.max_attempts:
                    raise
                if on_reconnect is not None:
                    on_reconnect(Reconnect(attempt, after, error))
            finally:
                await events.aclose()
            await sleep(delay)
            delay = min(delay * 2, self._backoff.max_delay)

    async def get(self, run_id: str) -> Run:
        """A run's record."""
        r = await self._rpc.unary(self._rpc.runs.GetRun, run_pb2.GetRunRequest(run_id=run_id), run_pb2.GetRunResponse)
        return Run.of(r.run)

    async def list(
        self,
        *,
        thread_id: str = "",
        status: RunStatus | None = None,
        query: str = "",
        limit: int = 100,
    ) -> builtins.list[Run]:
        """Runs newest first, at most ``limit``: of one thread, of one
        status, whose ids, harness, definition, command or prompt contain
        ``query``; page after page."""
        runs: builtins.list[Run] = []
        token = ""
        while len(runs) < limit:
            request = run_pb2.ListRunsRequest(
                thread_id=thread_id,
                limit=min(limit - len(runs), 1000),
                query=query,
                status=status.wire() if status is not None else run_pb2.RUN_STATUS_UNSPECIFIED,
                page_token=token,
            )
            page = await self._rpc.unary(self._rpc.runs.ListRuns, request, run_pb2.ListRunsResponse)
            runs.extend(Run.of(r) for r in page.runs)
            token = page.next_page_token
            if not token:
                break
        return runs[:limit]

    async def active(self, thread_id: str) -> Run | None:
        """The newest run of a thread that has not ended, if any."""
        request = run_pb2.GetActiveRunRequest(thread_id=thread_id)
        r = await self._rpc.unary(self._rpc.runs.GetActiveRun, request, run_pb2.GetActiveRunResponse)
        return Run.of(r.run) if r.HasField("run") else None

    async def cancel(self, run_id: str) -> Run:
        """Cancel a run: its CLI is killed, its sandbox destroyed, its record
        ``aborted`` (once the driver has stopped it). A terminal run is left
        as it is."""
        request = run_pb2.CancelRunRequest(run_id=run_id)
        r = await self._rpc.unary(self._rpc.runs.CancelRun, request, run_pb2.CancelRunResponse)
        return Run.of(r.run)

    async def delete(self, run_id: str) -> None:
        """Remove an ended run with its log and requests (a run still going
        is FailedPrecondition: cancel it first)."""
        request = run_pb2.DeleteRunRequest(run_id=run_id)
        await self._rpc.unary(self._rpc.runs.DeleteRun, request, run_pb2.DeleteRunResponse)

    async def start_attempts(
        self,
        *,
        thread_id: str,
        count: int = 0,
        attempts: Sequence[tuple[str, str]] = (),
        harness: str | None = None,
        definition_id: str = "",
        command: Sequence[str] | None = None,
        prompt: str = "",
        options: run_pb2.HarnessOptions | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> run_pb2.AttemptSet:
        """Run one task ``count`` times (or once per ``(harness, model)`` of
        ``attempts``, each empty part the run's), each attempt a durable run
        in a fork of the thread's latest checkpoint; follow each with
        ``stream(attempt.run_id)``. The set, as started."""
        run = _run_request(thread_id, harness, definition_id, command, prompt, options, secrets)
        run.durable = True
        request = run_pb2.StartAttemptsRequest(
            run=run,
            count=count,
            attempts=[run_pb2.AttemptSpec(harness=h, model=m) for h, m in attempts],
        )
        r = await self._rpc.unary(self._rpc.runs.StartAttempts, request, run_pb2.StartAttemptsResponse)
        return r.set

    async def attempt_set(self, attempt_set_id: str) -> run_pb2.AttemptSet:
        """A set of attempts: each attempt's status and, once evaluated, its
        diff against the starting checkpoint, test exit code, tokens and
        duration."""
        request = run_pb2.GetAttemptSetRequest(attempt_set_id=attempt_set_id)
        r = await self._rpc.unary(self._rpc.runs.GetAttemptSet, request, run_pb2.GetAttemptSetResponse)
        return r.set

    async def attempt_patch(self, attempt_set_id: str, run_id: str) -> str:
        """An evaluated attempt's changes as a unified diff."""
        request = run_pb2.GetAttemptPatchRequest(attempt_set_id=attempt_set_id, run_id=run_id)
        r = await self._rpc.unary(self._rpc.runs.GetAttemptPatch, request, run_pb2.GetAttemptPatchResponse)
        return r.patch

    async def promote_attempt(self, attempt_set_id: str, run_id: str) -> run_pb2.PromoteAttemptResponse:
        """Make an evaluated attempt the thread's: its files and its
        conversation are what the thread's next run continues from."""
        request = run_pb2.PromoteAttemptRequest(attempt_set_id=attempt_set_id, run_id=run_id)
        return await self._rpc.unary(self._rpc.runs.PromoteAttempt, request, run_pb2.PromoteAttemptResponse)


def _run_request(
    thread_id: str,
    harness: str | None,
    definition_id: str,
    command: Sequence[str] | None,
    prompt: str,
    options: run_pb2.HarnessOptions | None,
    secrets: Mapping[str, str] | None,
) -> run_pb2.StartRunRequest:
    """The StartRunRequest of a run (or of every attempt of a set): its
    harness ("command" when ``command``, its argv, is given) and options."""
    opts = run_pb2.HarnessOptions()
    if options is not None:
        opts.CopyFrom(options)
    if command is not None:
        opts.command[:] = list(command)
    return run_pb2.StartRunRequest(
        thread_id=thread_id,
        definition_id=definition_id,
        harness=harness or ("command" if command is not None else ""),
        options=opts,
        prompt=prompt,
        secrets=dict(secrets or {}),
    )


class AsyncRequests:
    """``client.requests``: what runs ask their clients."""

    def __init__(self, rpc: AsyncRpc, runs: AsyncRuns) -> None:
        self._rpc = rpc
        self._runs = runs

    async def list(self, run_id: str, *, include_answered: bool = False) -> builtins.list[RunRequest]:
        """A run's requests still waiting (or all), in the order it asked."""
        request = run_pb2.ListRequestsRequest(run_id=run_id, include_answered=include_answered)
        r = await self._rpc.unary(self._rpc.runs.ListRequests, request, run_pb2.ListRequestsResponse)
        return [RunRequest.of(x) for x in r.requests]

    async def allow(self, run_id: str, request_id: str, *, message: str = "", always: bool = False) -> RunRequest:
        """Allow a permission request (``always``: the tool for the rest of the run)."""
        answer = run_pb2.PermissionAnswer(allow=True, message=message, always=always)
        return await self._respond(run_pb2.RespondToRequestRequest(run_id=run_id, request_id=request_id, permission=answer))

    async def deny(self, run_id: str, request_id: str, *, message: str = "") -> RunRequest:
        """Deny a permission request; ``message`` is told to the harness."""
        answer = run_pb2.PermissionAnswer(allow=False, message=message)
        return await self._respond(run_pb2.RespondToRequestRequest(run_id=run_id, request_id=request_id, permission=answer))

    async def tool_result(self, run_id: str, request_id: str, content: str, *, is_error: bool = False) -> RunRequest:
        """Answer a client tool call with its result."""
        result = run_pb2.ToolResult(content=content, is_error=is_error)
        return await self._respond(run_pb2.RespondToRequestRequest(run_id=run_id, request_id=request_id, tool_result=result))

    async def _respond(self, request: run_pb2.RespondToRequestRequest) -> RunRequest:
        r = await self._rpc.unary(self._rpc.runs.RespondToRequest, request, run_pb2.RespondToRequestResponse)
        return RunRequest.of(r.request)

    async def handle(
        self,
        run_id: str,
        *,
        permission: PermissionHandler | None = None,
        tools: Mapping[str, ClientToolFn] | None = None,
        after_offset: str = "",
    ) -> builtins.list[RunRequest]:
        """Follow a run to its end (resuming like ``runs.stream``), answering
        each request as it arrives: permissions with ``permission(chunk)``
        (none: left for others to answer), client tool calls by running
        ``tools[name](input)`` (a missing tool, or one that raises, is an
        error result the model is told). A request answered already
        elsewhere is passed over. Returns the answers given."""
        answered: builtins.list[RunRequest] = []
        async for chunk in self._runs.stream(run_id, after_offset=after_offset):
            request = chunk.request
            if request is None:
                continue
            try:
                if chunk.asks_permission and permission is not None:
                    decision = await resolve(permission(chunk))
                    allow, message = decision if isinstance(decision, tuple) else (decision, "")
                    if allow:
                        answered.append(await self.allow(run_id, request.request_id, message=message))
                    else:
                        answered.append(await self.deny(run_id, request.request_id, message=message))
                elif chunk.awaits_client_tool:
                    content, is_error = await _run_tool(tools or {}, chunk.tool_name, request.input)
                    answered.append(await self.tool_result(run_id, request.request_id, content, is_error=is_error))
            except SandholdError as error:
                if error.reason != "FAILED_PRECONDITION":  # answered already
                    raise
        return answered


async def _run_tool(tools: Mapping[str, ClientToolFn], name: str, tool_input: Any) -> tuple[str, bool]:
    # Claude Code names a client tool mcp__sandhold__<name>.
    fn = tools.get(name) or tools.get(name.removeprefix("mcp__sandhold__"))
    if fn is None:
        return f"no client tool {name}", True
    try:
        return str(await resolve(fn(tool_input))), False
    except Exception as e:  # the model is told; the run goes on
        return f"{name} failed: {e}", True

