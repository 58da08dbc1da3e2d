#!/usr/bin/env bash
# The TypeScript client's and the web console's tests against the real
# `sandhold serve` (node --test): the client over gRPC-Web with dropped
# connections, typed errors, the checked-in generated code and console
# bundle, and the console in headless Chromium.
#
# Installs Node, npm and Chromium from the distribution when missing (as
# root, Debian/Ubuntu), `npm ci` in this package (the lock pins every
# version), builds it (tsc), and runs the tests. The binaries: SANDHOLD_BIN /
# SANDHOLD_AGENT_BIN, else built with cargo (into $CARGO_TARGET_DIR or
# target/). CHROMIUM names the browser (default /usr/bin/chromium). Under
# SANDHOLD_REQUIRE_SERVICES=1 a missing Chromium fails the browser tests
# instead of skipping them. Extra arguments go to node --test.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ -z "${CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  missing+=(chromium)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "run-tests.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
  else
    echo "run-tests.sh: missing ${missing[*]} (install them, or run as root on Debian)" >&2
  fi
fi
command -v node >/dev/null || { echo "run-tests.sh: node is required" >&2; exit 1; }

. "$repo/scripts/lib/binaries.sh"
binaries_build "$repo"

cd "$here"
# npm ci only when the lock changed since the last install.
stamp=node_modules/.sandhold-lock.sha
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
npm run -s build
exec node --test "$@" test/*.test.mjs
