"""The library on each TensorFlow release between the two CI runs (2.15.1
and 2.21.0): one venv per release, as a user would make it, and the
release-sensitive tests in it.

For each release (default 2.16 to 2.20), on Python 3.12 from pyenv: a venv
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
# The test tools, as requirements-newest.lock pins them.
TOOLS = ("pytest==8.3.4", "pytest-xdist==3.8.0", "pytest-randomly==3.16.0",
         "pytest-timeout==2.3.1")


def _python312():
  """Python 3.12 from pyenv (every release here has its wheels)."""
  try:
    prefix = subprocess.run(["pyenv", "prefix", "3.12.1"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return os.path.join(prefix, "bin", "python")
  except (OSError, subprocess.CalledProcessError):
    found = sorted(glob.glob(os.path.expanduser(
        "~/.pyenv/versions/3.12*/bin/python")))
    if not found:
      raise SystemExit(
          "every_release: no Python 3.12 (pyenv install 3.12)") from None
    return found[-1]


def _venv(release, venvs):
  """The venv of `release`, made once: (its python, or None; why not)."""
  path = os.path.join(venvs, f"tf-{release}")
  python = os.path.join(path, "bin", "python")
  done = os.path.join(path, ".installed")
  if os.path.exists(done):
    return python, ""
  subprocess.run([_python312(), "-m", "venv", "--clear", path], check=True)
  install = subprocess.run(
      [python, "-m", "pip", "install", "--quiet", f"tensorflow~={release}.0",
       f"tf-keras~={release}.0", *TOOLS], capture_output=True, text=True,
      check=False)
  if install.returncode != 0:
    return None, install.stderr.strip().splitlines()[-1][:200]
  project = subprocess.run(
      [python, "-m", "pip", "install", "--quiet", "-e", ROOT],
      capture_output=True, text=True, check=False)
  if project.returncode != 0:
    return None, project.stderr.strip().splitlines()[-1][:200]
  open(done, "w").close()
  return python, ""


def _versions(python, legacy):
  code = ("import tensorflow as tf; print(tf.__version__, "
          "tf.keras.__version__)")
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
