"""The base of every error the client raises for a failed call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import grpc


class SandholdError(Exception):
    """A failed call of the Sandhold API.

    ``reason`` is the stable reason the server put in the error's
    ``google.rpc.ErrorInfo`` (domain ``sandhold.dev``; errors.proto lists
    them, and each has a subclass: :class:`sandhold.NotFound`,
    :class:`sandhold.RunTerminal`, ...), or ``"TRANSPORT"`` when the answer
    did not come from Sandhold (a dropped connection, a proxy) and carries
    none (:class:`TransportError`). A reason this client does not know (a
    newer server) is a plain ``SandholdError`` with that reason.
    """

    reason: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: The gRPC status code.
        self.code = code
        #: ErrorInfo metadata (e.g. ``max`` of JOURNAL_FULL).
        self.metadata: Mapping[str, str] = dict(metadata or {})
        if reason is not None and reason != type(self).reason:
            # An instance's reason shadows the class's (unknown reasons).
            self.__dict__["reason"] = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}" if self.reason else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, code={self.code.name}, message={self.message!r})"


class TransportError(SandholdError):
    """The call failed on the way (connection refused or dropped, a proxy's
    answer): no Sandhold reason. ``code`` says what gRPC saw."""

    reason = "TRANSPORT"
