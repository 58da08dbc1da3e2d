"""The real `sandhold serve` for the example's test (started by the helper
the Python suite uses, tests/python/sandhold_server.py, which run.sh puts on
PYTHONPATH; the client is the `sandhold` package, installed by run.sh)."""

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
    from sandhold import Sandhold

    with Sandhold(addr, token=TOKEN) as client:
        for sandbox in client.sandboxes.list():
            client.sandboxes.destroy(sandbox.sandbox_id)
