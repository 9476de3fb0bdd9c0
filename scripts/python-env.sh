# Sourced by the scripts that need Python packages (setup-test-deps.sh, test.sh, tinyllm.sh):
# the project's own virtual environment under the cache, first on PATH, so `python3` and its
# pip are the venv's. A distribution's Python (Debian 12+, Ubuntu 23.04+) refuses
# `pip install` outside one (PEP 668, "externally-managed-environment"); a venv works with any
# Python 3 and leaves the system's packages alone.
#   . scripts/python-env.sh && tinyllm_python_env [PACKAGE...]
# Creates the venv where missing (Debian's python3 needs python3-venv for that: installed with
# apt-get where this runs as root), installs the packages it lacks, and exports PATH.
tinyllm_python_env() {
  local venv="${TINYLLM_VENV:-${TINYLLM_CACHE:-$HOME/.cache/tinyllm}/venv}"
  if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -m pip --version >/dev/null 2>&1; then
    command -v python3 >/dev/null || { echo "python3 is needed (Python 3.9 or later)" >&2; return 1; }
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      fi
      python3 -m venv "$venv" || {
        echo "cannot create a Python virtual environment at $venv: install python3-venv" >&2
        return 1
      }
    fi
  fi
  export PATH="$venv/bin:$PATH"
  local pkg
  for pkg in "$@"; do
    python3 -c "import $pkg" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check "$pkg"
  done
}
