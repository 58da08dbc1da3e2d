"""How the client finds its server and token, as the CLI does: addresses
(HOST:PORT, http://, https:// with TLS, unix:PATH), the token from the
environment, and a server on this machine's `local-token`; the background
server on its Unix socket, reached with nothing set but the data dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import support
from sandhold import Sandhold, TransportError
from sandhold._connection import resolve_target, resolve_token


def test_addresses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SANDHOLD_CA_CERT", raising=False)
    plain = resolve_target("http://127.0.0.1:7443/")
    assert (plain.address, plain.credentials, plain.on_this_machine) == ("127.0.0.1:7443", None, True)
    assert resolve_target("sandhold.example:7443").credentials is None
    tls = resolve_target("https://sandhold.example:7443")
    assert tls.address == "sandhold.example:7443" and tls.credentials is not None and not tls.on_this_machine
    unix = resolve_target("unix:/run/sandhold.sock")
    assert unix.address == "unix:/run/sandhold.sock" and ("grpc.default_authority", "localhost") in unix.options
    with pytest.raises(ValueError, match="not a way to reach a server"):
        resolve_target("ftp://x:1")
    with pytest.raises(ValueError, match="for TLS"):
        resolve_target("http://x:1", ca_cert=b"pem")
    monkeypatch.setenv("SANDHOLD_SERVER", "https://from-env:1")
    assert resolve_target(None).address == "from-env:1"

    (tmp_path / "local-token").write_text("from-file\n")
    monkeypatch.delenv("SANDHOLD_TOKEN", raising=False)
    assert resolve_token(None, plain, tmp_path) == "from-file"
    assert resolve_token(None, tls, tmp_path) is None  # never sent to another machine
    monkeypatch.setenv("SANDHOLD_TOKEN", "from-env")
    assert resolve_token(None, plain, tmp_path) == "from-env"
    assert resolve_token("given", plain, tmp_path) == "given"


def test_the_background_server_on_its_unix_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    sandhold = support.binary("SANDHOLD_BIN", "sandhold")
    with support.scratch_dir() as root:
        data = root / "data"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env["SANDHOLD_AGENT_BINARY"] = support.binary("SANDHOLD_AGENT_BIN", "sandhold-agent")
        subprocess.run([sandhold, "daemon", "start", "--data-dir", str(data)], env=env, check=True,
                       capture_output=True, timeout=120)
        try:
            for var in ("SANDHOLD_SERVER", "SANDHOLD_TOKEN", "SANDHOLD_CA_CERT"):
                monkeypatch.delenv(var, raising=False)
            monkeypatch.setenv("SANDHOLD_DATA_DIR", str(data))
            with Sandhold() as client:  # the socket and the local token, found in the data dir
                assert client.target == f"unix:{data}/daemon/sandhold.sock"
                assert client.server_info().tenant
                run = client.runs.start(thread_id="py-unix", command=["echo", "over a socket"],
                                        definition_id=_local(client))
                assert run.text() == "over a socket\n" and run.completed
        finally:
            subprocess.run([sandhold, "daemon", "stop", "--data-dir", str(data)], env=env, capture_output=True,
                           timeout=120)


def test_tls_with_the_servers_ca_from_an_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with support.server(tls=True) as server:
        assert server.address.startswith("https://")
        assert server.ca_cert is not None
        with server.client() as client:  # ca_cert= the test CA
            run = client.runs.start(thread_id="py-tls", command=["echo", "over TLS"], definition_id=_local(client))
            assert run.text() == "over TLS\n" and run.completed
        ca_file = server.data_dir.parent / "ca.pem"
        monkeypatch.setenv("SANDHOLD_SERVER", server.address)
        monkeypatch.setenv("SANDHOLD_TOKEN", server.token)
        monkeypatch.setenv("SANDHOLD_CA_CERT", str(ca_file))
        with Sandhold() as client:  # everything from the environment
            assert client.server_info().tenant == support.TENANT
        # Without the CA the server's certificate is not trusted: no call
        # goes through, and the token is never sent in the clear.
        monkeypatch.delenv("SANDHOLD_CA_CERT")
        with Sandhold(timeout=5) as client, pytest.raises(TransportError):
            client.server_info()


def _local(client: Sandhold) -> str:
    from sandhold import definition

    client.definitions.put(definition("py-unix", local=True))
    return "py-unix"
