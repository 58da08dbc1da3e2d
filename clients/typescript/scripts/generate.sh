#!/usr/bin/env bash
# Regenerate src/gen from ../../proto (sandhold.v1) and proto/ (the vendored
# google/rpc/error_details.proto) with protoc-gen-es, through buf (both npm
# dev dependencies: `npm ci` first). `--check` regenerates into a temporary
# copy and fails if the checked-in code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  npx buf generate --template "$(cat buf.gen.yaml | sed "s#out: src/gen#out: $tmp/gen#")"
  diff -r "$tmp/gen" src/gen || { echo "src/gen is stale: run npm run generate" >&2; exit 1; }
  exit 0
fi
npx buf generate
