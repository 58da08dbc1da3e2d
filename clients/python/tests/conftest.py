"""One real `sandhold serve` (SQLite, a temporary data dir, one API token)
for the tests that need no other; tests that need their own start it
through support.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import support
from sandhold import Sandhold, definition


@pytest.fixture(scope="session")
def server() -> Iterator[support.Server]:
    with support.server() as s:
        yield s


@pytest.fixture()
def client(server: support.Server) -> Iterator[Sandhold]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def local_definition(server: support.Server) -> str:
    """A definition of local sandboxes with one setup step."""
    with server.client() as c:
        c.definitions.put(definition("py-local", local=True, setup=["echo made > made.txt"]))
    return "py-local"
