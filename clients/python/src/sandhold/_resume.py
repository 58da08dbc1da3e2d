"""When and how a run's stream resumes after a dropped connection (the
same rules as the TypeScript client's)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from sandhold._error_base import SandholdError

# Codes of a stream cut by the network rather than answered by the server.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
}


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts to resume a run's stream: from
    ``initial_delay`` seconds, doubling to ``max_delay``; at most
    ``max_attempts`` in a row without a chunk (None: no limit)."""

    initial_delay: float = 0.1
    max_delay: float = 2.0
    max_attempts: int | None = None


@dataclass(frozen=True)
class Reconnect:
    """What an ``on_reconnect`` callback is told before each attempt."""

    attempt: int
    after_offset: str
    error: SandholdError


def resumable(error: SandholdError) -> bool:
    """Worth attaching again: the connection broke (no Sandhold reason), or
    the server said UNAVAILABLE (starting, stopping, a dependency down). A
    Sandhold answer with any other reason is final."""
    return error.reason == "UNAVAILABLE" or (error.reason == "TRANSPORT" and error.code in _TRANSIENT)
