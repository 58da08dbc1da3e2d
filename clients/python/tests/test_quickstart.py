"""The README's Python quickstart, as written: its first ```python block,
run by a fresh virtualenv's python after `pip install ./clients/python`
(dependencies from the registry, as on a fresh machine), with only
SANDHOLD_SERVER and SANDHOLD_TOKEN set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import support


def quickstart() -> str:
    readme = (support.REPO / "README.md").read_text()
    section = readme[readme.index("\n## Python client\n"):]
    match = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert match, "README.md: no ```python block under ## Python client"
    return match.group(1)


def test_the_readme_quickstart_after_pip_install(server: support.Server, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", str(support.HERE.parent)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_") and k != "PYTHONPATH"}
    env |= {"SANDHOLD_SERVER": server.address, "SANDHOLD_TOKEN": server.token}
    out = subprocess.run([python, str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "hello from the sandbox\n"
    # And it imported the installed package, not this checkout's.
    where = subprocess.run([python, "-c", "import sandhold; print(sandhold.__file__)"], env=env,
                           capture_output=True, text=True, cwd=tmp_path)
    assert str(env_dir) in where.stdout, where.stdout
    assert sys.executable != python
