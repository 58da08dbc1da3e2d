"""Typed values of the API's common answers (runs, sandboxes, files,
requests, checkpoints) and builders of its common requests (definitions,
policies, commands). Each value keeps its protobuf message as ``raw``; the
less common answers (git, sweeps) are the generated messages themselves,
typed by their .pyi stubs."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sandhold.chunks import ChunkRequest, Usage, _json
from sandhold.v1 import admin_pb2, run_pb2, sandbox_pb2, snapshot_pb2


class RunStatus(enum.Enum):
    """A run's status (RunStatus without its prefix)."""

    UNSPECIFIED = "UNSPECIFIED"
    RUNNING = "RUNNING"
    INTERRUPTED = "INTERRUPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"

    @classmethod
    def of(cls, wire: int) -> RunStatus:
        return cls(run_pb2.RunStatus.Name(wire).removeprefix("RUN_STATUS_"))

    def wire(self) -> str:
        """The wire enum's name (protobuf takes it for the number)."""
        return f"RUN_STATUS_{self.value}"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED)


@dataclass(frozen=True)
class Run:
    """A run's record."""

    run_id: str
    thread_id: str
    status: RunStatus
    harness: str
    definition_id: str
    durable: bool
    started_at_ms: int
    finished_at_ms: int | None
    #: Set when failed or aborted: (code, message).
    error_code: str
    error_message: str
    usage: Usage
    sandbox_id: str
    detached_since_ms: int | None
    cancel_requested: bool
    forked_from_run: str
    #: The harness session the run worked in; the thread's next run continues it.
    session_id: str
    command: list[str]
    prompt: str
    raw: run_pb2.Run = field(repr=False, compare=False)

    @classmethod
    def of(cls, r: run_pb2.Run) -> Run:
        return cls(
            r.run_id,
            r.thread_id,
            RunStatus.of(r.status),
            r.harness,
            r.definition_id,
            r.durable,
            r.started_at_ms,
            r.finished_at_ms if r.HasField("finished_at_ms") else None,
            r.error.code,
            r.error.message,
            Usage.of(r.usage),
            r.sandbox_id,
            r.detached_since_ms if r.HasField("detached_since_ms") else None,
            r.cancel_requested,
            r.forked_from_run,
            r.session_id,
            list(r.command),
            r.prompt,
            r,
        )


@dataclass(frozen=True)
class RunRequest:
    """A request of a run as its log records it (RequestsApi.list)."""

    request_id: str
    #: "permission", "client_tool" or "network" (a connection under a network.ask rule).
    kind: str
    tool: str
    input: Any
    rule: str
    tool_call_id: str
    deadline_ms: int
    offset: str
    #: Whether it was answered, and how.
    answered: bool
    allowed: bool
    message: str
    answered_by: str
    raw: run_pb2.RunRequest = field(repr=False, compare=False)

    @classmethod
    def of(cls, r: run_pb2.RunRequest) -> RunRequest:
        a = r.answer
        return cls(
            r.request_id,
            r.kind,
            r.tool,
            _json(r.input_json, {}),
            r.rule,
            r.tool_call_id,
            r.deadline_ms,
            r.offset,
            r.HasField("answer"),
            a.allowed,
            a.message,
            a.answered_by,
            r,
        )


@dataclass(frozen=True)
class Sandbox:
    """A sandbox of a thread."""

    sandbox_id: str
    definition_id: str
    thread_id: str
    provider: str
    created_at_ms: int
    #: RUNNING, STOPPED, MISSING, or UNSPECIFIED when not asked for.
    state: str
    env: dict[str, str]
    raw: sandbox_pb2.Sandbox = field(repr=False, compare=False)

    @classmethod
    def of(cls, s: sandbox_pb2.Sandbox) -> Sandbox:
        return cls(
            s.sandbox_id,
            s.definition_id,
            s.thread_id,
            s.provider,
            s.created_at_ms,
            sandbox_pb2.SandboxState.Name(s.state).removeprefix("SANDBOX_STATE_"),
            dict(s.env),
            s,
        )


@dataclass(frozen=True)
class Ready:
    """An ensured sandbox: how it came to be, and the sandbox."""

    sandbox_id: str
    #: CREATED, RESUMED or SNAPSHOT_RESTORED.
    outcome: str
    sandbox: Sandbox
    restored_checkpoint_id: str
    raw: sandbox_pb2.EnsureReady = field(repr=False, compare=False)

    @classmethod
    def of(cls, r: sandbox_pb2.EnsureReady) -> Ready:
        return cls(
            r.sandbox_id,
            sandbox_pb2.EnsureOutcome.Name(r.outcome).removeprefix("ENSURE_OUTCOME_"),
            Sandbox.of(r.sandbox),
            r.restored_checkpoint_id,
            r,
        )


@dataclass(frozen=True)
class ExecResult:
    """What a command run with ``sandboxes.exec`` did."""

    #: The exit code; None when a signal ended it.
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int
    raw: sandbox_pb2.ExecResponse = field(repr=False, compare=False)

    @classmethod
    def of(cls, r: sandbox_pb2.ExecResponse) -> ExecResult:
        code, sig = exit_status(r.status)
        return cls(
            code,
            sig,
            r.stdout,
            r.stderr,
            r.stdout_truncated,
            r.stderr_truncated,
            r.timed_out,
            r.duration_ms,
            r,
        )

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


def exit_status(s: sandbox_pb2.ExitStatus) -> tuple[int | None, int | None]:
    """(exit code, signal) of an ExitStatus."""
    which = s.WhichOneof("status")
    return (s.code if which == "code" else None, s.signal if which == "signal" else None)


@dataclass(frozen=True)
class FileInfo:
    """A file or directory of a sandbox."""

    path: str
    name: str
    #: FILE, DIRECTORY, SYMLINK, OTHER.
    type: str
    size: int
    mode: int
    mtime_ms: int
    symlink_target: str
    raw: sandbox_pb2.FileInfo = field(repr=False, compare=False)

    @classmethod
    def of(cls, f: sandbox_pb2.FileInfo) -> FileInfo:
        return cls(
            f.path,
            f.name,
            sandbox_pb2.FileType.Name(f.type).removeprefix("FILE_TYPE_"),
            f.size,
            f.mode,
            f.mtime_ms,
            f.symlink_target,
            f,
        )

    @property
    def is_dir(self) -> bool:
        return self.type == "DIRECTORY"


@dataclass(frozen=True)
class FileEvent:
    """A change under a watched path."""

    #: CREATE, CHANGE, DELETE, RENAME, RESCAN.
    type: str
    path: str
    timestamp_ms: int
    from_path: str
    is_dir: bool
    raw: sandbox_pb2.FileEvent = field(repr=False, compare=False)

    @classmethod
    def of(cls, e: sandbox_pb2.FileEvent) -> FileEvent:
        return cls(
            sandbox_pb2.FileEventType.Name(e.type).removeprefix("FILE_EVENT_TYPE_"),
            e.path,
            e.timestamp_ms,
            e.from_path,
            e.is_dir,
            e,
        )


@dataclass(frozen=True)
class Checkpoint:
    """A portable snapshot of a thread's workspace."""

    checkpoint_id: str
    thread_id: str
    parent_id: str
    run_id: str
    label: str
    created_at_ms: int
    file_count: int
    total_bytes: int
    head: bool
    forked_from: str
    raw: snapshot_pb2.Checkpoint = field(repr=False, compare=False)

    @classmethod
    def of(cls, c: snapshot_pb2.Checkpoint) -> Checkpoint:
        return cls(
            c.checkpoint_id,
            c.thread_id,
            c.parent_id,
            c.run_id,
            c.label,
            c.created_at_ms,
            c.file_count,
            c.total_bytes,
            c.head,
            c.forked_from,
            c,
        )


@dataclass(frozen=True)
class Fork:
    """A thread forked from a checkpoint: its first checkpoint, and the ids
    of the runs copied into it."""

    checkpoint: Checkpoint
    run_ids: list[str]


@dataclass(frozen=True)
class ServerInfo:
    """Who the caller is (its tenant) and what the server is."""

    server_version: str
    tenant: str
    replica_id: str
    store_backend: str
    lease_backend: str

    @classmethod
    def of(cls, r: admin_pb2.GetServerInfoResponse) -> ServerInfo:
        return cls(r.server_version, r.tenant, r.replica_id, r.store_backend, r.lease_backend)


Effect = Literal["allow", "ask", "deny"]
Action = Literal["command", "file_write", "network"]


@dataclass(frozen=True)
class Rule:
    """One rule of a policy: ``Rule("command", "git push*", "deny")``."""

    action: Action
    pattern: str
    effect: Effect


@dataclass(frozen=True)
class Policy:
    """What an agent may do without asking: rules over commands, file
    writes and hosts, the first match deciding, else ``default``."""

    default: Effect = "allow"
    rules: Sequence[Rule] = ()
    #: How long a request waits for an answer before it is denied (0: the server's 10 minutes).
    request_timeout_ms: int = 0

    def to_proto(self) -> sandbox_pb2.SandboxPolicy:
        return sandbox_pb2.SandboxPolicy(
            default=_effect(self.default),
            rules=[
                sandbox_pb2.PolicyRule(
                    action=f"POLICY_ACTION_{r.action.upper()}",
                    pattern=r.pattern,
                    effect=_effect(r.effect),
                )
                for r in self.rules
            ],
            request_timeout_ms=self.request_timeout_ms,
        )


def _effect(e: Effect) -> str:
    return f"POLICY_EFFECT_{e.upper()}"


def command(cmd: str | Sequence[str]) -> sandbox_pb2.Command:
    """A shell line (str) or an argv (list) as a Command."""
    if isinstance(cmd, str):
        return sandbox_pb2.Command(shell=cmd)
    return sandbox_pb2.Command(argv=sandbox_pb2.Argv(args=list(cmd)))


def definition(
    id: str,
    *,
    local: bool = False,
    image: str | None = None,
    repo: str | None = None,
    ref: str = "",
    setup: Sequence[str | Sequence[str]] = (),
    env: Mapping[str, str] | None = None,
    secret_names: Sequence[str] = (),
    policy: Policy | None = None,
    portable_snapshots: bool = False,
    **fields: Any,
) -> sandbox_pb2.SandboxDefinition:
    """A SandboxDefinition for the common cases: a local sandbox
    (``local=True``, no isolation: development only) or a Docker one
    (``image=``), a git ``repo`` checked out as the workspace (else an empty
    one), ``setup`` steps (a str runs serially in the setup shell; a list of
    str is a parallel group), environment, the names of secrets its runs
    need, a policy, portable snapshots on. Other SandboxDefinition fields
    (lifecycle, network, ...) as protobuf messages in ``fields``."""
    if local == (image is not None):
        raise ValueError("a definition is either local=True or image=...")
    provider = (
        sandbox_pb2.ProviderSpec(local=sandbox_pb2.LocalProvider())
        if local
        else sandbox_pb2.ProviderSpec(docker=sandbox_pb2.DockerProvider(image=image or ""))
    )
    source = (
        sandbox_pb2.Source(git=sandbox_pb2.GitSource(url=repo, ref=ref))
        if repo
        else sandbox_pb2.Source(none=sandbox_pb2.NoSource())
    )
    steps = [
        sandbox_pb2.SetupStep(serial=s)
        if isinstance(s, str)
        else sandbox_pb2.SetupStep(parallel=sandbox_pb2.ParallelGroup(commands=list(s)))
        for s in setup
    ]
    d = sandbox_pb2.SandboxDefinition(
        id=id,
        provider=provider,
        workspace=sandbox_pb2.WorkspaceDefinition(source=source, setup=steps),
        env=dict(env or {}),
        secret_names=list(secret_names),
        **fields,
    )
    if policy is not None:
        d.policy.CopyFrom(policy.to_proto())
    if portable_snapshots:
        d.lifecycle.portable_snapshots.enabled = True
    return d
