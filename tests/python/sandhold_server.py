"""Start the real `sandhold serve` for Python tests (this suite's conftest and
examples/python's): a free loopback port, a temporary data dir, one API
token; waits for health SERVING and stops it with SIGTERM, which must exit 0."""

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_serving(addr, deadline, proc, log_path):
    """Until health says SERVING (stores open), using the raw encoding of
    grpc.health.v1 so no generated code or reflection is needed: an empty
    HealthCheckRequest, and status field 1 = SERVING (1)."""
    import grpc

    with grpc.insecure_channel(addr) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda _: b"",
            response_deserializer=lambda raw: raw,
        )
        while True:
            try:
                if check(None, timeout=5) == b"\x08\x01":
                    return
            except grpc.RpcError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sandhold did not become SERVING:\n{open(log_path).read()}")
            time.sleep(0.1)


@contextlib.contextmanager
def running_server(tenant, token, extra_args=()):
    """Yields the server's "127.0.0.1:PORT". SANDHOLD_BIN names the binary."""
    binary = os.environ.get("SANDHOLD_BIN")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail("SANDHOLD_BIN must point at the sandhold binary (run.sh sets it)")
    with tempfile.TemporaryDirectory(prefix="sandhold-py-") as data_dir:
        port = free_port()
        log_path = os.path.join(data_dir, "server.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        # Tokens never go on a command line (every user can read it).
        env["SANDHOLD_TOKENS"] = f"{tenant}={token}"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir,
                 "--shutdown-grace-ms", "3000", *extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"sandhold exited with {proc.returncode}:\n{open(log_path).read()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"sandhold did not listen in time:\n{open(log_path).read()}")
                    time.sleep(0.1)
            _wait_serving(f"127.0.0.1:{port}", deadline, proc, log_path)
            yield f"127.0.0.1:{port}"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                print(open(log_path).read())
            assert code == 0, f"sandhold exited with {code} after SIGTERM"
