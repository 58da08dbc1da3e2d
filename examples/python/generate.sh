#!/usr/bin/env bash
# Generate the Python client of sandhold.v1 from proto/ with grpcio-tools.
#
#   examples/python/generate.sh OUT_DIR     (then PYTHONPATH=OUT_DIR)
#
# Needs grpcio-tools (requirements.txt). Produces sandhold/v1/*_pb2.py and
# *_pb2_grpc.py; nothing generated is committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
out=${1:?usage: generate.sh OUT_DIR}
mkdir -p "$out"
python=${PYTHON:-python3}
"$python" -m grpc_tools.protoc -I "$proto" --python_out="$out" --grpc_python_out="$out" \
  "$proto"/sandhold/v1/*.proto
