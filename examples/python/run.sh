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

. "$repo/scripts/lib/binaries.sh"
. "$repo/scripts/lib/python.sh"
binaries_build "$repo"

venv=${SANDHOLD_PY_EXAMPLE_VENV:-$target/python-example-venv}
python_venv "$venv" "$here/requirements.txt"

"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$repo/clients/python"
export PYTHONPATH="$repo/tests/python${PYTHONPATH:+:$PYTHONPATH}"

cd "$here"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
