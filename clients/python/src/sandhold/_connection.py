"""Where a client connects and what it sends with every call, as the CLI
reads them (control-plane/src/cli/client.rs): the server from the argument
or ``SANDHOLD_SERVER`` (``HOST:PORT``, ``http://HOST:PORT``,
``https://HOST:PORT`` for TLS, or ``unix:PATH``), the token from the
argument or ``SANDHOLD_TOKEN`` (else, for a server on this machine, the
data dir's ``local-token``), sent as ``authorization: Bearer TOKEN``."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

SERVER_VAR = "SANDHOLD_SERVER"
TOKEN_VAR = "SANDHOLD_TOKEN"
CA_CERT_VAR = "SANDHOLD_CA_CERT"
DATA_DIR_VAR = "SANDHOLD_DATA_DIR"
#: Where `sandhold serve` listens by default.
DEFAULT_SERVER = "127.0.0.1:7443"

# Reconnect soon after a dropped connection (gRPC's default waits 1 s and
# more): run streams resume through the same channel.
_CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class Target:
    """A resolved server: the gRPC target, its credentials (None: plain
    text) and channel options."""

    address: str
    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, int | str]] = field(default_factory=list)
    on_this_machine: bool = False


def default_data_dir() -> Path:
    """The server's default data dir, as `sandhold` resolves it."""
    if os.environ.get(DATA_DIR_VAR):
        return Path(os.environ[DATA_DIR_VAR])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sandhold"


def resolve_target(
    server: str | None,
    *,
    ca_cert: str | os.PathLike[str] | bytes | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    options: list[tuple[str, int | str]] | None = None,
) -> Target:
    """The target of ``server`` (None: ``SANDHOLD_SERVER``, else the
    background server's socket when there is one, else 127.0.0.1:7443)."""
    if server is None:
        server = os.environ.get(SERVER_VAR) or ""
    if not server:
        socket = default_data_dir() / "daemon" / "sandhold.sock"
        server = f"unix:{socket}" if socket.exists() else DEFAULT_SERVER
    if ca_cert is None and os.environ.get(CA_CERT_VAR):
        ca_cert = os.environ[CA_CERT_VAR]
    extra = [*_CHANNEL_OPTIONS, *(options or [])]
    if server.startswith("unix:"):
        # grpc-core would send the %-encoded socket path as :authority,
        # which the server rejects as a host.
        return Target(server, credentials, [*extra, ("grpc.default_authority", "localhost")], True)
    scheme, sep, rest = server.partition("://")
    if not sep:
        scheme, rest = "http", server
    if scheme not in ("http", "https"):
        raise ValueError(
            f"server {server!r}: {scheme}:// is not a way to reach a server; "
            "write HOST:PORT, http://HOST:PORT, https://HOST:PORT (TLS) or unix:PATH"
        )
    authority = rest.split("/", 1)[0]
    if not authority:
        raise ValueError(f"server {server!r} names no host")
    if scheme == "https" and credentials is None:
        root = ca_cert if isinstance(ca_cert, bytes) or ca_cert is None else Path(ca_cert).read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=root)
    elif scheme == "http" and ca_cert is not None:
        raise ValueError(f"a CA certificate is for TLS: write the server as https://{authority}")
    return Target(authority, credentials, extra, _is_loopback(authority))


def _is_loopback(authority: str) -> bool:
    host, _, port = authority.rpartition(":")
    if not host or not port.isdigit():
        host = authority
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | None, target: Target, data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The token: ``token``, else ``SANDHOLD_TOKEN``, else for a server on
    this machine the data dir's ``local-token`` file (what a server without
    API tokens asks for; never sent to another machine)."""
    if token:
        return token
    if os.environ.get(TOKEN_VAR):
        return os.environ[TOKEN_VAR]
    if target.on_this_machine:
        path = (Path(data_dir) if data_dir is not None else default_data_dir()) / "local-token"
        try:
            return path.read_text().strip() or None
        except OSError:
            return None
    return None


def call_metadata(token: str | None) -> list[tuple[str, str]]:
    """The metadata of one call: the token, and the caller's OpenTelemetry
    context as W3C ``traceparent`` (and ``tracestate``) when the
    ``opentelemetry`` package is installed and a span is current."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    return metadata + _trace_context()


def _trace_context() -> list[tuple[str, str]]:
    try:
        from opentelemetry import propagate
    except ImportError:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k.lower(), v) for k, v in carrier.items() if k.lower() in ("traceparent", "tracestate")]
