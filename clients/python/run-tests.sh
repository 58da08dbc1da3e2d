#!/usr/bin/env bash
# The Python client's tests (pytest) against the real `sandhold serve`:
# every method once, run streams across dropped connections and a killed
# replica (two replicas on PostgreSQL + Redis: scripts/services --env says
# where; under SANDHOLD_REQUIRE_SERVICES=1 a missing service fails, else
# those tests skip), a request answered from Python, errors by reason, the
# examples, the README's quickstart after `pip install ./clients/python`
# into a fresh virtualenv, the checked-in generated code, and mypy --strict.
#
# Installs python3-venv when missing (as root, Debian/Ubuntu), makes a
# virtualenv under the target dir (reused between runs) with the pinned
# requirements-dev.txt, installs this package into it, and runs pytest. The
# binaries: SANDHOLD_BIN / SANDHOLD_AGENT_BIN, else built with cargo (into
# $CARGO_TARGET_DIR or target/). Extra arguments go to pytest.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "run-tests.sh: installing python3-venv" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null; }
  else
    echo "run-tests.sh: python3 with venv is required (apt-get install python3-venv)" >&2
    exit 1
  fi
fi

. "$repo/scripts/lib/binaries.sh"
binaries_build "$repo"

venv=${SANDHOLD_PY_CLIENT_VENV:-$target/python-client-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp=$venv/.requirements.sha
want=$(sha256sum "$here/requirements-dev.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q -r "$here/requirements-dev.txt"
  echo "$want" > "$stamp"
fi
# The package as a user gets it (not editable): what pip builds of this folder.
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$here"

cd "$here/tests"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
