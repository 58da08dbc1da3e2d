"""A run's chunks as typed values, from the wire's ``sandhold.v1.Chunk``
(one message with every field): :class:`Chunk` keeps the fields its
:class:`ChunkType` uses, CUSTOM values parsed from JSON, and the offset to
resume after. The protobuf message stays reachable as ``chunk.raw``."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from sandhold.v1 import events_pb2, run_pb2, sandbox_pb2


class ChunkType(enum.Enum):
    """What a chunk is (events.proto's ChunkType without its prefix);
    ``UNKNOWN`` is a type this client does not know (a newer server)."""

    UNKNOWN = "UNKNOWN"
    RUN_STARTED = "RUN_STARTED"
    TEXT_MESSAGE_START = "TEXT_MESSAGE_START"
    TEXT_MESSAGE_CONTENT = "TEXT_MESSAGE_CONTENT"
    TEXT_MESSAGE_END = "TEXT_MESSAGE_END"
    REASONING_START = "REASONING_START"
    REASONING_CONTENT = "REASONING_CONTENT"
    REASONING_END = "REASONING_END"
    TOOL_CALL_START = "TOOL_CALL_START"
    TOOL_CALL_ARGS = "TOOL_CALL_ARGS"
    TOOL_CALL_END = "TOOL_CALL_END"
    TOOL_CALL_RESULT = "TOOL_CALL_RESULT"
    RUN_FINISHED = "RUN_FINISHED"
    RUN_ERROR = "RUN_ERROR"
    CUSTOM = "CUSTOM"
    PERMISSION_REQUESTED = "PERMISSION_REQUESTED"
    PERMISSION_RESOLVED = "PERMISSION_RESOLVED"

    @classmethod
    def of(cls, wire: int) -> ChunkType:
        name = events_pb2.ChunkType.Name(wire) if wire in events_pb2.ChunkType.values() else ""
        try:
            return cls(name.removeprefix("CHUNK_TYPE_"))
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class Usage:
    """Token counts and cost of a run (summed over its model calls)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None

    @classmethod
    def of(cls, u: events_pb2.Usage) -> Usage:
        return cls(
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
            u.reasoning_tokens,
            u.cost_usd if u.HasField("cost_usd") else None,
        )


@dataclass(frozen=True)
class ChunkRequest:
    """The request a chunk is about (a permission under an ``ask`` rule, or
    a call of a client tool): answer it with ``client.requests.allow``,
    ``deny`` or ``tool_result``."""

    request_id: str
    #: "permission", "client_tool" or "network" (a connection under a network.ask rule).
    kind: str
    #: The policy rule that asked ("ask command:git *", "default").
    rule: str
    #: When it is denied unless answered, ms since the Unix epoch.
    deadline_ms: int
    #: PERMISSION_REQUESTED: the tool call's input, parsed.
    input: Any
    #: PERMISSION_RESOLVED / TOOL_CALL_RESULT: the answer.
    allowed: bool
    answered_by: str
    #: TOOL_CALL_START of a client tool call: the client runs the tool.
    awaiting_client: bool

    @classmethod
    def of(cls, r: events_pb2.ChunkRequest) -> ChunkRequest:
        return cls(
            r.request_id,
            r.kind,
            r.rule,
            r.deadline_ms,
            _json(r.input_json, {}),
            r.allowed,
            r.answered_by,
            r.awaiting_client,
        )


@dataclass(frozen=True)
class Chunk:
    """One chunk of a run's log. Fields that do not apply to its ``type``
    keep their defaults."""

    type: ChunkType
    #: Attach after this offset to receive what follows this chunk.
    offset: str
    run_id: str
    thread_id: str
    timestamp_ms: int
    #: TEXT_MESSAGE_*, REASONING_*.
    message_id: str = ""
    #: *_CONTENT: text; TOOL_CALL_ARGS: a piece of the JSON arguments.
    delta: str = ""
    #: TOOL_CALL_*.
    tool_call_id: str = ""
    tool_name: str = ""
    parent_message_id: str = ""
    #: TOOL_CALL_RESULT.
    content: str = ""
    is_error: bool = False
    exit_code: int | None = None
    #: RUN_FINISHED.
    finish_reason: str = ""
    usage: Usage | None = None
    #: RUN_ERROR.
    error_message: str = ""
    error_code: str = ""
    #: CUSTOM: the event's name and its JSON value, parsed.
    name: str = ""
    value: Any = None
    #: PERMISSION_*, and client tool calls.
    request: ChunkRequest | None = None
    raw: events_pb2.Chunk = field(default_factory=events_pb2.Chunk, repr=False, compare=False)

    @classmethod
    def of(cls, rc: run_pb2.RunChunk) -> Chunk:
        c = rc.chunk
        return cls(
            type=ChunkType.of(c.type),
            offset=rc.offset,
            run_id=c.run_id,
            thread_id=c.thread_id,
            timestamp_ms=c.timestamp_ms,
            message_id=c.message_id,
            delta=c.delta,
            tool_call_id=c.tool_call_id,
            tool_name=c.tool_name,
            parent_message_id=c.parent_message_id,
            content=c.content,
            is_error=c.is_error,
            exit_code=c.exit_code if c.HasField("exit_code") else None,
            finish_reason=c.finish_reason,
            usage=Usage.of(c.usage) if c.HasField("usage") else None,
            error_message=c.error_message,
            error_code=c.error_code,
            name=c.name,
            value=_json(c.value_json, None),
            request=ChunkRequest.of(c.request) if c.HasField("request") else None,
            raw=c,
        )

    @property
    def text(self) -> str:
        """The assistant text this chunk adds ("" for other types)."""
        return self.delta if self.type is ChunkType.TEXT_MESSAGE_CONTENT else ""

    @property
    def is_terminal(self) -> bool:
        """Whether the chunk ends its run (RUN_FINISHED or RUN_ERROR)."""
        return self.type in (ChunkType.RUN_FINISHED, ChunkType.RUN_ERROR)

    @property
    def asks_permission(self) -> bool:
        """A permission request waiting for an answer."""
        return self.type is ChunkType.PERMISSION_REQUESTED and self.request is not None

    @property
    def awaits_client_tool(self) -> bool:
        """A call of a client tool the client must run and answer."""
        return self.type is ChunkType.TOOL_CALL_START and self.request is not None and self.request.awaiting_client


@dataclass(frozen=True)
class Progress:
    """A step of preparing a sandbox (EnsureSandbox, and StartRun before its
    first chunk); not stored, no offset."""

    #: RESOLVING, RESUMING, CREATING, CLONING, SETUP, ... (EnsurePhase without its prefix).
    phase: str
    message: str
    step: int
    steps: int
    command: str
    output_line: str
    elapsed_ms: int
    warning: str
    raw: sandbox_pb2.EnsureProgress = field(repr=False, compare=False)

    @classmethod
    def of(cls, p: sandbox_pb2.EnsureProgress) -> Progress:
        return cls(
            sandbox_pb2.EnsurePhase.Name(p.phase).removeprefix("ENSURE_PHASE_"),
            p.message,
            p.step,
            p.steps,
            p.command,
            p.output_line,
            p.elapsed_ms,
            p.warning,
            p,
        )


def _json(text: str, empty: Any) -> Any:
    if not text:
        return empty
    try:
        return json.loads(text)
    except ValueError:
        return text
