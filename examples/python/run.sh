#!/usr/bin/env bash
# The Python example (examples/python/durable_run.py) against the real
# `sandhold serve`: generates the client from proto/ with grpcio-tools into a
# temp dir, installs the pinned requirements into a virtualenv under the
# target dir (reused between runs), and runs its pytest file. The server is
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

gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
PYTHON=$venv/bin/python "$here/generate.sh" "$gen"
export PYTHONPATH="$gen:$repo/tests/python${PYTHONPATH:+:$PYTHONPATH}"

cd "$here"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
