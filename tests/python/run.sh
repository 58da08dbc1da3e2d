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
binaries_build "$repo"

venv=${SANDHOLD_PY_VENV:-$target/python-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp=$venv/.requirements.sha
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
  echo "$want" > "$stamp"
fi

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
