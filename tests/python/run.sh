#!/usr/bin/env bash
# Python gRPC client tests against the real `sandhold serve`.
#
# Builds the binaries if SANDHOLD_BIN / SANDHOLD_AGENT_BIN are not given, installs the requirements
# into a virtualenv under the target dir (reused between runs), and runs
# pytest. The server itself is started by conftest.py on a free loopback
# port with a temporary data dir. Extra arguments go to pytest.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

. "$repo/scripts/lib/binaries.sh"
. "$repo/scripts/lib/python.sh"
binaries_build "$repo"

venv=${SANDHOLD_PY_VENV:-$target/python-venv}
python_venv "$venv" "$here/requirements.txt"

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
