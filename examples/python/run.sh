#!/usr/bin/env bash
# The Python examples (examples/python/durable_run.py, answer_requests.py)
# against the real `sandhold serve`: installs the pinned requirements and the
# `sandhold` package of this checkout (clients/python) into a virtualenv
# under the target dir (reused between runs), and runs their pytest files. The server is
# started by conftest.py (tests/python/sandhold_server.py) with the local
# provider, whose agent is the sandhold-agent built next to sandhold.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

if [ -z "${SANDHOLD_BIN:-}" ]; then
  (cd "$repo" && cargo build -q -p control-plane --bin sandhold -p sandbox-agent --bin sandhold-agent)
  SANDHOLD_BIN=$target/debug/sandhold
fi
export SANDHOLD_BIN

venv=${SANDHOLD_PY_EXAMPLE_VENV:-$target/python-example-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp=$venv/.requirements.sha
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
  echo "$want" > "$stamp"
fi

"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$repo/clients/python"
export PYTHONPATH="$repo/tests/python${PYTHONPATH:+:$PYTHONPATH}"

cd "$here"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
