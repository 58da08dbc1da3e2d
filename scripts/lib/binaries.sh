# Sourced by the client test suites (tests/python/run.sh,
# examples/python/run.sh, clients/python/run-tests.sh,
# clients/typescript/run-tests.sh): the binaries under test. SANDHOLD_BIN and
# SANDHOLD_AGENT_BIN when given, else built with cargo into $CARGO_TARGET_DIR
# (or target/); both exported.
#
#   binaries_build REPO

binaries_build() {
  local repo=$1 target=${CARGO_TARGET_DIR:-$1/target}
  if [ -z "${SANDHOLD_BIN:-}" ]; then
    (cd "$repo" && cargo build -q -p control-plane --bin sandhold)
    SANDHOLD_BIN=$target/debug/sandhold
  fi
  export SANDHOLD_BIN
  if [ -z "${SANDHOLD_AGENT_BIN:-}" ]; then
    (cd "$repo" && cargo build -q -p sandbox-agent --bin sandhold-agent)
    SANDHOLD_AGENT_BIN=$target/debug/sandhold-agent
  fi
  export SANDHOLD_AGENT_BIN
}
