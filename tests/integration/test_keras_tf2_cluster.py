"""TensorFlow 2 Keras across processes: MultiWorkerMirroredStrategy over 2
worker processes configured by TF_CONFIG (`python -m tfconfig launch`),
and a job stopped in the middle of a window that goes on in a new process
from `model.save_weights`."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness import keras_exactness as kx
from tests.jobs import keras_tf2_resume_job as job

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mwms_cells(tmp_path_factory):
  """Every cell the test below reads, trained on one cluster of 2 workers."""
  return kx.mwms_cells(["adam", "momentum"], ["float32", "mixed_float16"],
                       str(tmp_path_factory.mktemp("mwms")))


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_multi_worker_mirrored_equals_the_big_batch(optimizer, mwms_cells):
  """Two workers, each fitting plain Keras at the big batch and the window
  at the micro-batch from the same weights on the same examples: the same
  weights at 1e-5, one update per window; in mixed_float16, as close to
  float32 as Keras's own mixed-precision big batch."""
  big, accumulated, counts = mwms_cells[optimizer, "float32"]
  assert counts == {"big": kx.WINDOWS,
                    "accumulated": (kx.K * kx.WINDOWS, kx.WINDOWS)}
  assert kx.relative_difference(accumulated, big) <= kx.FLOAT32_TOLERANCE
  mixed_big, mixed, _ = mwms_cells[optimizer, "mixed_float16"]
  keras = kx.relative_difference(mixed_big, big)
  assert 1e-5 < keras
  assert kx.relative_difference(mixed, big) <= kx.MIXED_FACTOR * keras


def _phase(phase, directory, strategy, *flags):
  result = subprocess.run(
      [sys.executable, "tests/jobs/keras_tf2_resume_job.py", "--phase", phase,
       "--directory", str(directory), "--strategy", strategy, *flags],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(np.load(directory / f"{phase}.npz"))


@pytest.fixture(scope="module")
def ran_once(tmp_path_factory):
  """`_phase` run once per phase, strategy, kind and `--save` for the
  module: (its directory, its npz). The tests share the uninterrupted run
  and the first phase (which saves every way at once, `--save all`)."""
  runs = {}

  def run(phase, strategy, kind, save):
    key = (phase, strategy, kind, save)
    if key not in runs:
      directory = tmp_path_factory.mktemp(phase)
      runs[key] = (directory, _phase(phase, directory, strategy, "--kind",
                                     kind, "--save", save))
    return runs[key]
  return run


# save_weights; the model as a SavedModel (model.save(dir), ModelCheckpoint
# without a .keras ending), which Keras's load_model compiles with an
# optimizer made anew (its own optimizers start afresh there: Adam's
# update count 0); before, ours refused to train on. Under MirroredStrategy
# Keras 2.15 loads a SavedModel's variables without their layers' names
# (two `kernel`s): the window keys the second `kernel_1`; before, it refused
# them. BackupAndRestore: a job stopped at an epoch's start, whose epochs
# end inside windows, fit again.
@pytest.mark.keras2
@pytest.mark.parametrize("strategy,kind,save", [
    ("one", "new", "weights"), ("mirrored", "new", "weights"),
    ("one", "new", "savedmodel"), ("one", "legacy", "savedmodel"),
    ("one", "new", "model_checkpoint"), ("one", "legacy", "model_checkpoint"),
    ("mirrored", "legacy", "weights"), ("mirrored", "new", "savedmodel"),
    ("mirrored", "legacy", "savedmodel"),
    ("mirrored", "new", "model_checkpoint"),
    ("mirrored", "legacy", "model_checkpoint"),
    ("mirrored", "new", "backup"), ("mirrored", "legacy", "backup"),
    # (One device with Keras's Adam: tests/unit/keras/test_keras_tf2.py.)
    ("one", "legacy", "backup")])
def test_saved_mid_window_resumes_in_a_new_process(strategy, kind, save,
                                                   tmp_path, ran_once):
  flags = ("--kind", kind, "--save", save)
  backup = save == "backup"
  _, whole = ran_once("whole", strategy, kind,
                      "backup" if backup else "weights")
  made, first = ran_once("first", strategy, kind,
                         "backup" if backup else "all")
  shutil.copytree(made, tmp_path, dirs_exist_ok=True)
  assert first["micro_batches"] == job.STOP and first["updates"] == 1
  second = _phase("second", tmp_path, strategy, *flags)
  # It went on where the first stopped, not from the start.
  assert second.pop("ran") == job.MICRO_BATCHES - job.STOP
  whole = {name: value for name, value in whole.items() if name != "ran"}
  assert second["micro_batches"] == whole["micro_batches"] == job.MICRO_BATCHES
  assert second["updates"] == whole["updates"] == job.MICRO_BATCHES // job.K
  for name in whole:
    np.testing.assert_allclose(second[name], whole[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)


@pytest.mark.keras3
def test_keras3_multi_worker_mirrored_equals_the_big_batch(tmp_path):
  """Keras 3 across 2 worker processes (a custom loop: Keras 3's fit does
  not run under MultiWorkerMirroredStrategy): each worker's window, at the
  micro-batch, equals the big batch on one device and Keras 3's own big
  batch under the strategy, clipped by clip_norm or by the inner
  optimizer's global_clipnorm too (one update per window)."""
  output = tmp_path / "results.json"
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--timeout", "300", "--", sys.executable,
       "tests/jobs/keras3_mwms_job.py", "--output", str(output)],
      capture_output=True, text=True, timeout=360)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  results = json.loads(output.read_text())
  assert results.pop("replicas") == 2
  assert set(results) == {"adam", "momentum", "clip_norm", "inner_clipnorm"}
  for name, case in results.items():
    assert case["one_device"] <= 1e-5, (name, case)
    assert (case["micro_batches"], case["updates"]) == (12, 3), (name, case)
    assert case.get("keras_big_batch", 0.0) <= 1e-5, (name, case)
  assert "keras_big_batch" in results["adam"]
