# Sourced by the Python suites (tests/python/run.sh, examples/python/run.sh,
# clients/python/run-tests.sh): a virtualenv of their own, reused between
# runs, with pinned requirements installed again only when the file changed;
# python3-venv installed first when missing (as root, Debian/Ubuntu).
#
#   python_venv VENV REQUIREMENTS     then run VENV/bin/python

python_venv() {
  local venv=$1 requirements=$2
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "python_venv: installing python3-venv" >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null; }
    else
      echo "python_venv: python3 with venv is required (apt-get install python3-venv)" >&2
      return 1
    fi
  fi
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  local stamp=$venv/.requirements.sha want
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$venv/bin/python" -m pip install -q -r "$requirements"
    echo "$want" > "$stamp"
  fi
}
