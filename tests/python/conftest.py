"""Starts the real `sandhold serve` on a free loopback port with a temporary
data dir and one API token, for the whole test session."""

import pytest

from sandhold_server import running_server

TENANT = "python"
TOKEN = "python-test-token-0123"


@pytest.fixture(scope="session")
def server():
    with running_server(TENANT, TOKEN) as addr:
        yield addr
