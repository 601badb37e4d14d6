"""Every benchmark script starts: its imports resolve and its command line
answers --help (the harness and the shared helpers moved under them would
otherwise break a script no test runs). The figures themselves are the
scripts' to measure, not a test's. One process runs them all, TensorFlow
imported once."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

# the benchmarks run as users run them.
pytestmark = [pytest.mark.slow, pytest.mark.grappler]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if "__main__" in p.read_text())
LIBRARIES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                   if p.name not in SCRIPTS)

_RUN_ALL = textwrap.dedent("""
    import contextlib, importlib, io, json, runpy, sys
    scripts, libraries = json.loads(sys.argv[1])
    sys.path.insert(0, ".")
    results = {}
    for script in scripts:
      sys.argv = ["benchmarks/" + script, "--help"]
      out = io.StringIO()
      try:
        with contextlib.redirect_stdout(out):
          runpy.run_path("benchmarks/" + script, run_name="__main__")
        results[script] = "returned without --help's exit"
      except SystemExit as exit:
        text = out.getvalue().lower()
        results[script] = ("ok" if exit.code in (0, None) and "usage" in text
                           else f"exit {exit.code}: {text[-300:]}")
      except Exception as error:  # noqa: BLE001 (reported, per script)
        results[script] = f"{type(error).__name__}: {error}"
    for library in libraries:
      try:
        importlib.import_module("benchmarks." + library)
        results[library] = "ok"
      except Exception as error:  # noqa: BLE001
        results[library] = f"{type(error).__name__}: {error}"
    print("RESULTS " + json.dumps(results))
""")


def test_every_script_answers_help_and_every_module_imports():
  assert len(SCRIPTS) > 20 and LIBRARIES
  # With the allocator settings a memory benchmark would re-execute itself
  # to get.
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
  done = subprocess.run(
      [sys.executable, "-c", _RUN_ALL, json.dumps([SCRIPTS, LIBRARIES])],
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  line = next((li for li in done.stdout.splitlines()
               if li.startswith("RESULTS ")), None)
  assert line, done.stderr[-3000:]
  results = json.loads(line[len("RESULTS "):])
  failed = {name: why for name, why in results.items() if why != "ok"}
  assert not failed, failed
  assert set(results) == set(SCRIPTS) | set(LIBRARIES)
