"""The public Estimator in TF_CONFIG jobs of processes (python -m tfconfig
launch, loopback), one script for every release (tests/jobs/estimator_job.py):
two MultiWorkerMirroredStrategy workers end at plain TensorFlow's big batch
of both workers' windows; a parameter-server job's chief, training alone on
the ps's variables, ends at the one-trainer big batch while its evaluator
task evaluates the final checkpoint. TensorFlow 2.15 (Estimator's
RunConfig and spec types) and 2.21 (the library's) alike."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from harness import support

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "jobs"))
import estimator_job  # noqa: E402

K, B, UPDATES = estimator_job.K, estimator_job.B, estimator_job.UPDATES
TIMEOUT = 300


def _launch(flags, kind, model_dir):
  command = [sys.executable, "-m", "tfconfig", "launch", *flags,
             "--timeout", str(TIMEOUT), "--", sys.executable,
             os.path.join(ROOT, "tests", "jobs", "estimator_job.py"), kind,
             str(model_dir)]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT + 60, check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-4000:]
  assert "Traceback" not in output, output[-4000:]
  return result.stdout


def _weights(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir))
  return {name: reader.get_tensor(name) for name in support.weight_names()}


def _expected(trainers):
  data = support.make_data(K * B * trainers * UPDATES)
  expected = support.reference_train(support.V1_OPTIMIZERS["adam"], data,
                                     K * B * trainers, UPDATES)
  support.assert_weights_moved(expected, "big batch")
  return expected


@pytest.mark.slow
def test_two_multi_worker_workers_equal_the_big_batch(tmp_path):
  stdout = _launch(["--workers", "2"], "multi_worker", tmp_path / "run")
  assert "[worker:0] worker:0 done" in stdout
  assert "[worker:1] worker:1 done" in stdout
  # In a cluster the training tasks train; none evaluates (as Estimator's).
  assert "metrics" not in stdout
  reader = tf.train.load_checkpoint(str(tmp_path / "run"))
  assert reader.get_tensor("global_step") == K * UPDATES
  support.assert_weights_close(
      _weights(tmp_path / "run"), _expected(2),
      what=f"2 workers, TensorFlow {tf.__version__}")


@pytest.mark.slow
def test_a_parameter_server_job_with_an_evaluator(tmp_path):
  stdout = _launch(["--chief", "--workers", "0", "--ps", "1", "--evaluator",
                    "--evaluator_wait", "120"], "parameter_server",
                   tmp_path / "run")
  assert "[chief:0] chief:0 done" in stdout
  lines = [line for line in stdout.splitlines()
           if line.startswith("[evaluator:0] metrics ")]
  assert len(lines) == 1, stdout[-3000:]
  metrics = json.loads(lines[0].split(" metrics ", 1)[1])
  assert metrics["global_step"] == K * UPDATES
  data = support.make_data(K * B * UPDATES)
  assert metrics["mean_label"] == pytest.approx(data["labels"].mean())
  assert os.listdir(tmp_path / "run" / "eval")
  support.assert_weights_close(
      _weights(tmp_path / "run"), _expected(1),
      what=f"chief on the ps, TensorFlow {tf.__version__}")


@pytest.mark.slow
def test_a_multi_worker_job_with_an_evaluator(tmp_path):
  """A chief and a worker under MultiWorkerMirroredStrategy, an evaluator
  task on one device (the job script makes no strategy there): the
  trainers end at the big batch, the evaluator evaluates the last
  checkpoint."""
  stdout = _launch(["--chief", "--workers", "1", "--evaluator",
                    "--evaluator_wait", "120"], "multi_worker",
                   tmp_path / "run")
  lines = [line for line in stdout.splitlines()
           if line.startswith("[evaluator:0] metrics ")]
  assert len(lines) == 1, stdout[-3000:]
  assert json.loads(lines[0].split(" metrics ", 1)[1])["global_step"] == (
      K * UPDATES)
  assert not any(line.startswith(("[chief:0] metrics", "[worker:0] metrics"))
                 for line in stdout.splitlines())
  support.assert_weights_close(
      _weights(tmp_path / "run"), _expected(2),
      what=f"chief and worker, TensorFlow {tf.__version__}")
