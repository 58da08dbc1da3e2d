"""The real `sandhold serve` for the example's test (started by the helper
the Python suite uses, tests/python/sandhold_server.py; run.sh puts it and
the generated client on PYTHONPATH)."""

import pytest

from sandhold_server import running_server

TENANT = "example"
TOKEN = "example-token-0123456"


@pytest.fixture(scope="session")
def server():
    # A server with a token turns the local provider off unless the
    # operator opts in; the example's sandboxes are local.
    with running_server(TENANT, TOKEN, extra_args=("--allow-local-with-tokens",)) as addr:
        yield addr
        _destroy_sandboxes(addr)


def _destroy_sandboxes(addr):
    """Local sandboxes outlive the server: remove the ones the tests made."""
    import grpc
    from sandhold.v1 import sandbox_pb2, sandbox_pb2_grpc

    md = [("authorization", f"Bearer {TOKEN}")]
    with grpc.insecure_channel(addr) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        for sandbox in stub.ListSandboxes(sandbox_pb2.ListSandboxesRequest(), metadata=md).sandboxes:
            stub.DestroySandbox(sandbox_pb2.DestroySandboxRequest(sandbox_id=sandbox.sandbox_id), metadata=md)
