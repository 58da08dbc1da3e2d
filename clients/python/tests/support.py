"""Test support: the real `sandhold serve` (alone, or replicas on one
PostgreSQL database and Redis), a TCP proxy in front of servers whose
connections a test can cut, the fake model, and cleanup of everything a
test started (servers, local sandboxes' agents, scratch databases)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold import Sandhold

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
TENANT = "py"


def binary(var: str, name: str) -> str:
    path = os.environ.get(var)
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    for candidate in (path, os.path.join(target, "debug", name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"no {name} binary: set {var} (run-tests.sh does)")


def static_agent() -> str:
    """The statically linked agent Docker sandboxes get ("" when not built:
    SANDHOLD_AGENT_STATIC_BIN, else where scripts/build-agent-static puts it)."""
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    for candidate in (os.environ.get("SANDHOLD_AGENT_STATIC_BIN"),
                      os.path.join(target, "static", "x86_64-unknown-linux-gnu", "debug", "sandhold-agent")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return ""


def docker_image(image: str = "sandhold-test-debian:latest") -> str:
    """An image for Docker sandboxes (scripts/build-test-images), with the
    engine and the static agent there; else skip (fail under scripts/test)."""
    if os.environ.get("SANDHOLD_TEST_DOCKER") != "1":
        need("Docker", "SANDHOLD_TEST_DOCKER is not 1")
    if not static_agent():
        need("the static agent", "SANDHOLD_AGENT_STATIC_BIN is not set (scripts/build-agent-static)")
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        need(image, "it is not built (scripts/build-test-images --debian)")
    return image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def required() -> bool:
    """Under scripts/test every service must be there."""
    return os.environ.get("SANDHOLD_REQUIRE_SERVICES") == "1"


def need(what: str, why: str) -> None:
    if required():
        pytest.fail(f"{what} is required (SANDHOLD_REQUIRE_SERVICES=1) but {why}; run scripts/services")
    pytest.skip(f"{what} not available ({why}); scripts/test provides it")


class TestCa:
    """A certificate authority of the test's own (openssl) and a server
    certificate it signed for localhost and 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.cert, self.key, ca = root / "server.pem", root / "server.key", root / "ca.pem"

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=sandhold test CA",
                "-keyout", "ca.key", "-out", str(ca))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(self.key),
                "-out", "server.csr")
        (root / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "1", "-extfile", "san.ext", "-out", str(self.cert))
        self.ca_cert = ca.read_bytes()


class Server:
    """One `sandhold serve`; ``stop()`` (SIGTERM, must exit 0) or ``kill()``."""

    def __init__(self, data_dir: Path, token: str, *, listen: str | None = None, args: tuple[str, ...] = (),
                 tls: TestCa | None = None) -> None:
        self.data_dir = data_dir
        self.token = token
        self.port = free_port()
        self.listen = listen or f"127.0.0.1:{self.port}"
        self.address = self.listen
        self.ca_cert: bytes | None = None
        if tls is not None:
            args = (*args, "--tls-cert", str(tls.cert), "--tls-key", str(tls.key))
            self.address = f"https://localhost:{self.port}"
            self.ca_cert = tls.ca_cert
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir.parent / f"server-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env["SANDHOLD_TOKENS"] = f"{TENANT}={token}"
        env["SANDHOLD_AGENT_BINARY"] = binary("SANDHOLD_AGENT_BIN", "sandhold-agent")
        if static_agent():
            env["SANDHOLD_AGENT_STATIC_BINARY"] = static_agent()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [binary("SANDHOLD_BIN", "sandhold"), "serve", "--listen", self.listen, "--data-dir", str(data_dir),
                 "--shutdown-grace-ms", "3000", "--allow-local-with-tokens", *args],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        self._wait_ready()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: object) -> Sandhold:
        if self.ca_cert is not None:
            kwargs.setdefault("ca_cert", self.ca_cert)
        return Sandhold(self.address, token=self.token, **kwargs)  # type: ignore[arg-type]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        with self.client() as client:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(f"sandhold exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    client.server_info()
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        pytest.fail(f"sandhold did not become ready:\n{self.log()}")
                    time.sleep(0.1)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        assert code == 0, f"sandhold exited with {code} after SIGTERM:\n{self.log()}"


def kill_sandboxes(data_dir: Path) -> None:
    """Local sandboxes outlive their server by design: kill every process
    whose command line names the data dir (their agents and shims)."""
    marker = str(data_dir).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    # Docker sandboxes too: containers whose host dir is under the data dir.
    if shutil.which("docker") is None:
        return
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=dev.sandhold.managed=true", "--format",
                             '{{.ID}} {{.Label "dev.sandhold.host-dir"}}'], capture_output=True, text=True)
    ours = [line.split()[0] for line in listed.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1].startswith(str(data_dir))]
    if ours:
        subprocess.run(["docker", "rm", "-f", *ours], capture_output=True)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandhold-pyc-"))
    try:
        yield path
    finally:
        kill_sandboxes(path)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def server(args: tuple[str, ...] = (), *, tls: bool = False) -> Iterator[Server]:
    """A server with SQLite in a temporary data dir (with `tls`, behind a
    certificate of a test CA); stopped, its sandboxes killed."""
    with scratch_dir() as root:
        ca = TestCa(root) if tls else None
        s = Server(root / "data", f"py-token-{secrets.token_hex(8)}", args=args, tls=ca)
        try:
            yield s
            with s.client() as client:  # what the tests made, through the API
                for sandbox in client.sandboxes.list():
                    client.sandboxes.destroy(sandbox.sandbox_id)
        finally:
            s.stop()


def _reachable(url: str) -> bool:
    rest = url.split("://", 1)[-1].rsplit("@", 1)[-1]
    hostport = rest.split("/", 1)[0].split("?", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except (OSError, ValueError):
        return False


def service_url(var: str, what: str) -> str:
    url = os.environ.get(var, "")
    if not url:
        need(what, f"{var} is not set")
    if not _reachable(url):
        need(what, f"{var}={url} is not reachable")
    return url


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A PostgreSQL database of its own (dropped after)."""
    name = f"sandhold_test_{uuid.uuid4().hex}"
    base, _, query = admin_url.partition("?")
    scheme, _, rest = base.partition("://")
    authority = rest.split("/", 1)[0]
    url = f"{scheme}://{authority}/{name}" + (f"?{query}" if query else "")
    subprocess.run(["psql", admin_url, "-q", "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    try:
        yield url
    finally:
        subprocess.run(["psql", admin_url, "-q", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                       capture_output=True)


class Proxy:
    """A TCP proxy on loopback in front of ``backends``: each connection
    goes to the first that accepts one. ``cut()`` drops every open
    connection (a dropped network); new ones are accepted as before."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.cuts = 0
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = None
            for port in self.backends:
                try:
                    upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
                    upstream.settimeout(None)
                    break
                except OSError:
                    continue
            if upstream is None:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._sockets.discard(src)
                self._sockets.discard(dst)

    def cut(self) -> None:
        self.cuts += 1
        self._drop()

    def _drop(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._drop()


def numbered_lines(n: int, every_s: float) -> list[str]:
    """A shell command printing line-1 .. line-N, one every ``every_s``."""
    return ["sh", "-c", f"i=1; while [ $i -le {n} ]; do echo line-$i; i=$((i+1)); sleep {every_s}; done"]


class FakeModel:
    """tests/fake-model/fake_model.py on a random loopback port."""

    def __init__(self, scenario: str, log: Path) -> None:
        self.proc = subprocess.Popen(
            ["python3", str(REPO / "tests" / "fake-model" / "fake_model.py"), "--scenario", scenario,
             "--port", "0", "--log", str(log)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        assert first.startswith("PORT="), first
        self.port = int(first.removeprefix("PORT="))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def cli(name: str) -> str:
    """An agent CLI scripts/install-agent-clis installed (else skip, or fail under scripts/test)."""
    path = Path(os.environ.get("SANDHOLD_CLI_DIR", "/opt/sandhold-clis")) / "node_modules" / ".bin" / name
    if not path.is_file():
        need(str(path), "it is not installed (scripts/install-agent-clis)")
    return str(path)
