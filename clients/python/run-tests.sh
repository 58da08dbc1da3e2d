#!/usr/bin/env bash
# The Python client's tests (pytest) against the real `sandhold serve`:
# every method once, run streams across dropped connections and a killed
# replica (two replicas on PostgreSQL + Redis: scripts/services --env says
# where; under SANDHOLD_REQUIRE_SERVICES=1 a missing service fails, else
# those tests skip), a request answered from Python, errors by reason, the
# examples, the README's quickstart after `pip install ./clients/python`
# into a fresh virtualenv, the checked-in generated code, and mypy --strict.
#
# Installs python3-venv when missing (scripts/lib/python.sh), makes a
# virtualenv under the target dir (reused between runs) with the pinned
# requirements-dev.txt, installs this package into it, and runs pytest. The
# binaries: SANDHOLD_BIN / SANDHOLD_AGENT_BIN, else built with cargo (into
# $CARGO_TARGET_DIR or target/). Extra arguments go to pytest.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

. "$repo/scripts/lib/binaries.sh"
. "$repo/scripts/lib/python.sh"
binaries_build "$repo"

venv=${SANDHOLD_PY_CLIENT_VENV:-$target/python-client-venv}
python_venv "$venv" "$here/requirements-dev.txt"
# The package as a user gets it (not editable): what pip builds of this folder.
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$here"

cd "$here/tests"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
