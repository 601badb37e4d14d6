"""`pip install .` installs the library and tfconfig, with only what they
import, as ranges; the scripts' needs are the `examples` extra. Installed
into a user's own TensorFlow (2.15's full build, 2.21 on Python 3.12), it
changes none of their packages, imports, and trains exactly."""

import glob
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
from packaging.requirements import Requirement

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The installs into fresh environments download TensorFlow (about 0.5 GB
# each): .ci/run runs them in a step of their own, with this set.
INSTALL_ENV = "ESTIMATOR_ACCUM_INSTALL_TESTS"
installs = pytest.mark.skipif(
    os.environ.get(INSTALL_ENV) != "1",
    reason=f"installs TensorFlow into fresh venvs; {INSTALL_ENV}=1 runs it "
           f"(.ci/run does, in its own step)")


def _wheel(tmp_path):
  # Built from a copy: a build in the checkout leaves build/ behind.
  source = tmp_path / "source"
  shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
      ".venv*", ".git", "build", "*.egg-info", "__pycache__", "runs"))
  subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
       "--no-build-isolation", "--wheel-dir", str(tmp_path), str(source)],
      check=True, capture_output=True, text=True, timeout=300)
  wheel, = tmp_path.glob("estimator_accum-*.whl")
  return wheel


def test_the_wheel_holds_the_library_the_launcher_and_clusterspec_only(
    tmp_path):
  wheel = _wheel(tmp_path)
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    metadata = archive.read(next(n for n in names
                                 if n.endswith("/METADATA"))).decode()
  top = {name.split("/")[0] for name in names}
  assert {t for t in top if not t.endswith(".dist-info")} == {
      "estimator_accum", "tfconfig", "clusterspec"}, top
  requires = [Requirement(line.split(":", 1)[1].strip())
              for line in metadata.splitlines()
              if line.startswith("Requires-Dist:")]
  core = {r.name: r for r in requires if r.marker is None}
  # Ranges, no TensorFlow build forced: the user's own stays.
  assert sorted(core) == ["PyYAML", "absl-py", "numpy"], core
  assert all(str(r.specifier) and "==" not in str(r.specifier)
             for r in core.values()), core
  by_extra = {}
  for r in requires:
    if r.marker is not None:
      extra = str(r.marker).split("==")[1].strip().strip('"')
      by_extra.setdefault(extra, []).append(r)
  for extra, build in (("cpu", "tensorflow-cpu"), ("tensorflow", "tensorflow"),
                       ("and-cuda", "tensorflow")):
    requirement, = by_extra[extra]
    assert requirement.name == build, (extra, requirement)
    assert requirement.specifier.contains("2.15.1")
    assert requirement.specifier.contains("2.21.0")
    assert not requirement.specifier.contains("2.22.0")
  assert by_extra["and-cuda"][0].extras == {"and-cuda"}
  assert any(r.name == "tokenizers" for r in by_extra["examples"])
  assert "Requires-Python: <3.14,>=3.9" in metadata


_CHECK = textwrap.dedent("""
    import json, numpy as np, tensorflow as tf
    import estimator_accum
    v1 = tf.compat.v1

    def train(k, batch, feeds):
      with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 3])
        w = v1.get_variable("w", initializer=tf.constant([[1.0], [-2.0], [0.5]]))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        optimizer = v1.train.AdamOptimizer(0.1)
        if k:
          op = estimator_accum.build_accumulating_train_op(
              loss, optimizer, k, summaries=False,
              log_every_n_micro_batches=None)
        else:
          op = optimizer.minimize(loss, v1.train.get_or_create_global_step())
        with v1.Session() as session:
          session.run(v1.global_variables_initializer())
          for start in range(0, len(feeds), batch):
            session.run(op, {x: feeds[start:start + batch]})
          return session.run(w)

    data = np.random.RandomState(0).normal(size=(96, 3)).astype(np.float32)
    big, accumulated = train(0, 32, data), train(4, 8, data)
    print(json.dumps({"tensorflow": tf.__version__,
                      "moved": float(np.abs(big - [[1.0], [-2.0], [0.5]]).max()),
                      "difference": float(np.abs(big - accumulated).max())}))
    """)


def _started_anew(**extra):
  """The environment for a process of another interpreter, started by exec
  (not the suite's fork server, tests/helpers/fork_start.py), with none of
  the suite's Python paths."""
  return dict(os.environ, ESTIMATOR_ACCUM_TEST_FORK="0", PYTHONPATH="",
              **extra)


def _freeze(python):
  listed = subprocess.run(
      [str(python), "-m", "pip", "list", "--format", "json",
       "--disable-pip-version-check"], env=_started_anew(),
      check=True, capture_output=True, text=True, timeout=120).stdout
  return {p["name"].lower(): p["version"] for p in json.loads(listed)}


def _python(version):
  """An interpreter of `version` ("3.11", "3.12"): the suite's own base
  interpreter when it is that version, else pyenv's or one on PATH."""
  if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
    return getattr(sys, "_base_executable", sys.executable)
  if shutil.which("pyenv"):
    pyenv = subprocess.run(["pyenv", "prefix", version], capture_output=True,
                           text=True, check=False)
    if pyenv.returncode == 0:
      return os.path.join(pyenv.stdout.strip(), "bin", "python")
  found = shutil.which(f"python{version}") or next(iter(sorted(
      glob.glob(os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser(
          "~/.pyenv")), "versions", f"{version}*", "bin", "python")))), None)
  if found:
    return found
  pytest.fail(f"no Python {version} here: the install test of that end "
              f"needs it (pyenv install {version}, or python{version} on PATH)")


@installs
@pytest.mark.parametrize("python, users", [
    ("3.11", ["tensorflow==2.15.1"]),
    ("3.12", ["tensorflow==2.21.0", "tf-keras==2.21.0"]),
], ids=["tf2.15-full-build", "tf2.21-py3.12"])
def test_installing_into_a_users_tensorflow_changes_none_of_their_packages(
    tmp_path, python, users):
  venv = tmp_path / "users_venv"
  subprocess.run([_python(python), "-m", "venv", str(venv)], check=True,
                 timeout=120, env=_started_anew())
  interpreter = venv / "bin" / "python"
  pip = [str(interpreter), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check"]
  # The user's own TensorFlow arrives by uv when the suite's venv has it
  # (./setup.sh installs it): both tests took 90 s so on 2 cores, 174 s by
  # pip in CI. What is tested, installing this project into it, is pip's,
  # as a user's would be.
  if importlib.util.find_spec("uv") is not None:
    theirs = [sys.executable, "-m", "uv", "pip", "install", "--quiet",
              "--python", str(interpreter)]
  else:
    theirs = pip
  subprocess.run(theirs + users, check=True, timeout=900, capture_output=True,
                 env=_started_anew())
  before = _freeze(interpreter)
  wheel = _wheel(tmp_path)
  subprocess.run(pip + [str(wheel)], check=True, timeout=300,
                 capture_output=True, env=_started_anew())
  after = _freeze(interpreter)
  changed = {name: (version, after.get(name))
             for name, version in before.items() if after.get(name) != version}
  assert not changed, f"installing estimator-accum changed {changed}"
  added = set(after) - set(before)
  # Only what it needs and the user lacked: itself and PyYAML.
  assert added <= {"estimator-accum", "pyyaml"}, added
  assert "tensorflow-cpu" not in after
  result = subprocess.run([str(interpreter), "-c", _CHECK], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=_started_anew(TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["tensorflow"] == users[0].split("==")[1]
  assert report["moved"] > 1e-2, report
  assert report["difference"] <= 1e-6, report
