# Sourced by scripts/test and scripts/bench: nothing they start may outlive
# them. Agents of local sandboxes (and of Docker ones: the host sees
# container processes) that were already running belong to someone else;
# only the ones the run leaves count against it. On a shared machine another
# checkout's tests may start agents meanwhile: an agent whose executable is a
# file of another build (outside this run's target dir) is theirs too.
#
#   leftovers_begin               remember the agents running now
#   leftovers_check               list the ones started since and still
#                                 running (after a grace of 5 s); status 1
#                                 if there is one

leftovers_target_dir=$(realpath -m "${CARGO_TARGET_DIR:-$PWD/target}")

leftovers_agents() { { pgrep -f 'sandhold-agent (init|serve)' || true; } | sort; }

leftovers_ours() {
  local pid exe
  for pid in "$@"; do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue # gone meanwhile
    exe=${exe% (deleted)}
    if [[ $exe != "$leftovers_target_dir"/* ]] && [ -f "$exe" ]; then continue; fi
    echo "$pid"
  done
}

leftovers_begin() { leftovers_before=$(leftovers_agents); }

leftovers_check() {
  # A process that is still stopping gets a moment; then what is left leaked.
  local left="" pid
  for _ in 1 2 3 4 5; do
    # shellcheck disable=SC2046 # one pid a word
    left=$(leftovers_ours $(comm -13 <(printf '%s\n' "$leftovers_before") <(leftovers_agents)))
    [ -z "$left" ] && break
    sleep 1
  done
  if [ -z "$left" ]; then
    echo "no sandhold-agent init/serve left running"
    return 0
  fi
  echo "FAILED: $(printf '%s\n' "$left" | wc -l) sandhold-agent process(es) outlived the run:"
  for pid in $left; do
    printf '  %s %s\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
  done
  return 1
}
