"""The examples, run as a person runs them (SANDHOLD_SERVER and
SANDHOLD_TOKEN in the environment), against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import support

EXAMPLES = support.HERE.parent / "examples"


def run_example(server: support.Server, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDHOLD_SERVER": server.address, "SANDHOLD_TOKEN": server.token}
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_command_run(server: support.Server) -> None:
    out = run_example(server, "command_run.py", "--", "sh", "-c", "cat made.txt; echo done")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "made by setup\ndone\n"
    failed = run_example(server, "command_run.py", "--", "sh", "-c", "exit 4")
    assert failed.returncode == 1


def test_thread(server: support.Server) -> None:
    out = run_example(server, "thread.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("from the first run\n2 runs on thread") and "one sandbox" in out.stdout


def test_fork_snapshot(server: support.Server) -> None:
    out = run_example(server, "fork_snapshot.py")
    assert out.returncode == 0, out.stderr
    assert "with 1 run(s)" in out.stdout and out.stdout.endswith("before the fork\n")


def test_claude_code_asks_and_python_answers(server: support.Server, tmp_path: Path) -> None:
    claude = support.cli("claude")
    model = support.FakeModel("tool", tmp_path / "model.log")
    home = tmp_path / "home"
    home.mkdir()
    try:
        out = run_example(server, "claude_code_asks.py", "write hello.txt", "--program", claude,
                          "--env", f"HOME={home}", "--env", f"ANTHROPIC_BASE_URL=http://127.0.0.1:{model.port}",
                          "--env", "ANTHROPIC_API_KEY=x")
    finally:
        model.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "allowed: Bash printf 'hello from the tool\\n' > hello.txt" in out.stderr
    assert "answered 1 request(s)" in out.stderr
    assert "I wrote hello.txt." in out.stdout
