"""The library on each TensorFlow release between the two CI runs (2.15.1
and 2.21.0): one venv per release, as a user would make it, and the
release-sensitive tests in it.

For each release (default 2.16 to 2.20), on Python 3.12 from pyenv (3.11
for 2.16-2.18, whose tf-keras fails on 3.12 by itself): a venv
under --venvs with `tensorflow~=X.Y.0`, `tf-keras~=X.Y.0`, pytest and this
project (no dependencies of its own beyond absl-py, numpy, PyYAML), then

- the graph path's exactness, every tf.compat.v1 optimizer and strategy
  (`tests/integration/test_every_release.py`, its fast tests), and the Keras
  tests (`tests/unit/integrations/`), with Keras 3 as tf.keras;
- the same with tf-keras (`TF_USE_LEGACY_KERAS=1`).

Prints one row per release and Keras: the versions, passed / failed /
skipped, and the seconds; exits 1 if anything failed or could not be
installed:

    .venv/bin/python benchmarks/every_release.py [--releases 2.16 2.18]
"""

import glob
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

RELEASES = ("2.16", "2.17", "2.18", "2.19", "2.20")
TESTS = ("tests/integration/test_every_release.py", "tests/unit/integrations/")
# What the tests use besides TensorFlow, pinned as requirements-newest.lock
# pins it (the tools, BERT's tokenizer and weights reader), and the data
# packages of requirements-data.txt.
FROM_THE_LOCK = ("pytest", "pytest-xdist", "pytest-randomly", "pytest-timeout",
                 "safetensors", "tokenizers", "huggingface_hub", "tf-slim")


def _pins():
  with open(os.path.join(ROOT, "requirements-newest.lock")) as lock:
    pinned = dict(line.strip().split("==", 1) for line in lock
                  if "==" in line and not line.startswith("#"))
  return [f"{name}=={pinned[name]}" for name in FROM_THE_LOCK]


# Python 3.12 for each release but 2.16-2.18, on 3.11: their tf-keras
# (2.16.0-2.18.0) seeds an initializer with random.randint(1, 1e9) once
# tf.keras.utils.set_random_seed was called, a float Python 3.12 refuses
# (TypeError), whatever the library does; tf-keras 2.19 passes an int.
PYTHONS = {"2.16": "3.11", "2.17": "3.11", "2.18": "3.11"}


def _python(release):
  """The pyenv Python the venv of `release` is made with."""
  version = PYTHONS.get(release, "3.12")
  found = sorted(glob.glob(os.path.expanduser(
      f"~/.pyenv/versions/{version}.*/bin/python")))
  if not found:
    raise SystemExit(f"every_release: no Python {version} (pyenv install "
                     f"{version})")
  return found[-1]


def _venv(release, venvs):
  """The venv of `release`, made once: (its python, or None; why not)."""
  path = os.path.join(venvs, f"tf-{release}")
  python = os.path.join(path, "bin", "python")
  done = os.path.join(path, ".installed")
  if os.path.exists(done):
    return python, ""
  if not os.path.exists(python):
    subprocess.run([_python(release), "-m", "venv", "--clear", path],
                   check=True)
  for step in (["tensorflow~=" + release + ".0", "tf-keras~=" + release + ".0",
                *_pins()],
               ["--no-deps", "-r", os.path.join(ROOT, "requirements-data.txt")],
               ["-e", ROOT]):
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", *step],
        capture_output=True, text=True, check=False)
    if install.returncode != 0:
      return None, install.stderr.strip().splitlines()[-1][:200]
  open(done, "w").close()
  return python, ""


def _versions(python, legacy):
  code = ("import tensorflow as tf; print(tf.__version__, getattr(tf.keras, "
          "'__version__', None) or __import__('tf_keras').__version__)")
  found = subprocess.run(
      [python, "-c", code], capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_USE_LEGACY_KERAS=legacy,
               TF_CPP_MIN_LOG_LEVEL="3"))
  return found.stdout.split() if found.returncode == 0 else ["?", "?"]


def _counts(output):
  """{"passed": n, "failed": n, "skipped": n, ...} from pytest's last
  line."""
  line = output.strip().splitlines()[-1] if output.strip() else ""
  return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", line)}


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--releases", nargs="+", default=list(RELEASES))
  parser.add_argument("--venvs", default=os.path.expanduser(
      "~/.cache/estimator_accum/releases"))
  parser.add_argument("--install_only", action="store_true",
                      help="make the venvs, run nothing")
  args = parser.parse_args()
  rows = bench.Rows("the release-sensitive tests on each TensorFlow release",
                    args.json, markdown=True)
  os.makedirs(args.venvs, exist_ok=True)
  for release in args.releases:
    python, why = _venv(release, args.venvs)
    if python is None:
      rows.fail(f"TensorFlow {release}: not installed: {why}")
      continue
    if args.install_only:
      continue
    for legacy, keras in (("0", "Keras 3"), ("1", "tf-keras")):
      tensorflow, keras_version = _versions(python, legacy)
      started = time.monotonic()
      run = subprocess.run(
          [python, "-m", "pytest", "-q", "-n", "2", "-m", "not slow",
           "-p", "no:cacheprovider", *TESTS], cwd=ROOT, capture_output=True,
          text=True, check=False,
          env=dict(os.environ, TF_USE_LEGACY_KERAS=legacy))
      counts = _counts(run.stdout)
      rows.add(tensorflow=tensorflow, keras=f"{keras} {keras_version}",
               passed=counts.get("passed", 0),
               failed=counts.get("failed", 0) + counts.get("error", 0) +
               counts.get("errors", 0),
               skipped=counts.get("skipped", 0),
               seconds=round(time.monotonic() - started))
      if run.returncode != 0:
        failed = [line for line in run.stdout.splitlines()
                  if line.startswith(("FAILED", "ERROR"))]
        rows.fail(f"TensorFlow {tensorflow} with {keras}: exit "
                  f"{run.returncode}: {'; '.join(failed[:5])}")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
