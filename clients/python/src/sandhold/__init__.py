"""Sandhold's Python client: run coding agents and commands in sandboxes,
durably, from Python.

    from sandhold import Sandhold, definition

    with Sandhold() as client:          # SANDHOLD_SERVER, SANDHOLD_TOKEN
        client.definitions.put(definition("dev", local=True))
        run = client.runs.start(thread_id="t1", definition_id="dev", command=["echo", "hi"])
        for chunk in run:
            print(chunk.text, end="")

``AsyncSandhold`` is the same API for asyncio. The generated messages are
in ``sandhold.v1`` (``run_pb2``, ``sandbox_pb2``, ...).
"""

from sandhold._async.client import AsyncSandhold
from sandhold._async.runs import AsyncRunStream
from sandhold._async.streams import AsyncFileWatch, AsyncPortConnection, AsyncProcess, AsyncTerminal, Output
from sandhold._resume import Backoff, Reconnect
from sandhold._sync.client import Sandhold
from sandhold._sync.runs import RunStream
from sandhold._sync.streams import FileWatch, PortConnection, Process, Terminal
from sandhold.chunks import Chunk, ChunkRequest, ChunkType, Progress, Usage
from sandhold.errors import *  # noqa: F403 (SandholdError and a class per reason)
from sandhold.errors import __all__ as _errors
from sandhold.models import (
    Checkpoint,
    ExecResult,
    FileEvent,
    FileInfo,
    Fork,
    Policy,
    Ready,
    Rule,
    Run,
    RunRequest,
    RunStatus,
    Sandbox,
    ServerInfo,
    command,
    definition,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncFileWatch",
    "AsyncPortConnection",
    "AsyncProcess",
    "AsyncRunStream",
    "AsyncSandhold",
    "AsyncTerminal",
    "Backoff",
    "Checkpoint",
    "Chunk",
    "ChunkRequest",
    "ChunkType",
    "ExecResult",
    "FileEvent",
    "FileInfo",
    "FileWatch",
    "Fork",
    "Output",
    "Policy",
    "PortConnection",
    "Process",
    "Progress",
    "Ready",
    "Reconnect",
    "Rule",
    "Run",
    "RunRequest",
    "RunStatus",
    "RunStream",
    "Sandbox",
    "Sandhold",
    "ServerInfo",
    "Terminal",
    "Usage",
    "command",
    "definition",
    *_errors,
]
