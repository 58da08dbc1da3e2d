"""What is checked in is what its sources make: the generated code of
proto/, the exception classes of errors.proto, the blocking client made
from the asyncio one; and the package's type hints hold under mypy --strict."""

from __future__ import annotations

import subprocess
import sys

import support
from sandhold import ChunkType, SandholdError, errors
from sandhold.v1 import errors_pb2, events_pb2

PACKAGE = support.HERE.parent


def test_generated_code_is_current() -> None:
    out = subprocess.run([sys.executable, str(PACKAGE / "scripts" / "generate.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_class_per_reason_of_errors_proto() -> None:
    from_proto = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}
    classes = {getattr(errors, name) for name in errors.__all__}
    by_reason = {c.reason: c for c in classes if isinstance(c, type) and issubclass(c, SandholdError)}
    assert set(errors.ERROR_REASONS) == from_proto
    assert set(by_reason) - {"", "TRANSPORT"} == from_proto
    assert by_reason["RUN_TERMINAL"].__name__ == "RunTerminal"
    assert by_reason["NOT_FOUND"].__name__ == "NotFound"


def test_a_chunk_type_per_chunk_type_of_events_proto() -> None:
    from_proto = {n.removeprefix("CHUNK_TYPE_") for n in events_pb2.ChunkType.keys()} - {"UNSPECIFIED"}
    assert {t.value for t in ChunkType} - {"UNKNOWN"} == from_proto


def test_mypy_strict_passes_on_the_package_and_its_examples() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PACKAGE / "pyproject.toml")],
                         capture_output=True, text=True, cwd=PACKAGE)
    assert out.returncode == 0, out.stdout + out.stderr
