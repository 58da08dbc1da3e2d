"""Errors of the Sandhold API as exceptions: :class:`SandholdError`, one
subclass per stable reason (generated from errors.proto into _reasons.py),
and the conversion of a ``grpc.RpcError``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import grpc
from google.rpc import error_details_pb2, status_pb2

from sandhold._error_base import SandholdError, TransportError
from sandhold._reasons import *  # noqa: F403 (every reason's class)
from sandhold._reasons import BY_REASON
from sandhold._reasons import __all__ as _reason_classes

#: The domain of Sandhold's ErrorInfo details.
ERROR_DOMAIN = "sandhold.dev"

#: Every reason the server sends, in errors.proto's order.
ERROR_REASONS: tuple[str, ...] = tuple(BY_REASON)

_STATUS_DETAILS = "grpc-status-details-bin"


def from_rpc_error(error: grpc.RpcError) -> SandholdError:
    """``error`` (a failed call, blocking or asyncio) as a SandholdError of
    the class of its reason."""
    code = _call_attr(error, "code")
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = _call_attr(error, "details")
    message = details if isinstance(details, str) else ""
    trailers = _call_attr(error, "trailing_metadata") or ()
    for key, value in cast(Iterable[tuple[str, object]], trailers):
        if key != _STATUS_DETAILS or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
                cls = BY_REASON.get(info.reason, SandholdError)
                return cls(message, code=code, reason=info.reason, metadata=dict(info.metadata))
    return TransportError(message or str(code), code=code)


def _call_attr(error: grpc.RpcError, name: str) -> object:
    """``error.name()``: blocking and asyncio errors both have code(),
    details() and trailing_metadata(), which grpc.RpcError does not declare."""
    fn = getattr(error, name, None)
    return fn() if callable(fn) else None


__all__ = ["ERROR_DOMAIN", "ERROR_REASONS", "SandholdError", "TransportError", "from_rpc_error", *_reason_classes]
