"""Every graph the project builds runs forward only in a plain Session.

With oneDNN on (TensorFlow 2.15's default on CPUs with AVX-512, and
run_classifier's on every CPU), Grappler's
remapper killed the process on a layer norm written with `tf.nn.moments`
when gamma was a variable and nothing asked for gradients (a protobuf CHECK,
then SIGSEGV; docs/troubleshooting.md). Each case runs in a fresh process
(tests/jobs/plain_session_job.py) with the default session configuration, so a
crash fails the test instead of the test run.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from models.bert import pretrained

# Whole jobs, processes or clusters: not the fast tier.
# oneDNN's fused layer norm is Grappler's remapper.
pytestmark = [pytest.mark.slow, pytest.mark.grappler]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_job(*args):
  # oneDNN on, whatever the CPU's default (off without AVX-512): its
  # remapper's fused layer norm is what killed the process, and
  # run_classifier turns it on everywhere.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="1")
  result = subprocess.run(
      [sys.executable, "-m", "tests.jobs.plain_session_job", *args], cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=300)
  if result.returncode < 0:
    pytest.fail(f"{args[0]}: the process was killed by "
                f"{signal.Signals(-result.returncode).name}:\n"
                f"{result.stderr[-2000:]}")
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])[args[0]]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
  return pretrained.minilm_checkpoint(str(tmp_path_factory.mktemp("cache")))


def test_pretrained_encoder_outputs_equal_the_reference(minilm):
  report = _run_job("bert_pretrained", minilm.bert_config_file,
                    minilm.init_checkpoint, pretrained.minilm_hf_dir())
  expected = {"embedding_output", "sequence_output", "pooled_output"} | {
      f"encoder_layer_{index}" for index in range(6)}
  assert set(report) == expected
  for name, difference in report.items():
    assert difference <= 1e-4, (name, difference)


def test_classifier_predicts():
  report = _run_job("classifier")
  assert report["rows_sum_to_one"] < 1e-6


@pytest.mark.estimator
def test_mnist_predicts():
  assert _run_job("mnist") == {"predictions": 5}


@pytest.mark.estimator
def test_housing_predicts():
  # The regressor starts at zero weights and a bias of 22.
  assert _run_job("housing") == {"initial_price": 22.0}


def test_library_batch_norm_runs_forward_only():
  report = _run_job("batch_norm")
  assert sorted(report) == sorted(
      f"rank{rank}_training_{training}" for rank in (3, 4)
      for training in (False, True))
  assert all(0.0 < value < 10.0 for value in report.values()), report


def test_library_train_op_runs_its_loss_alone_then_trains():
  report = _run_job("train_op")
  assert report["global_step"] == 4
  assert report["loss_after"] < report["loss_before"]


def test_tensorflow_layer_norms_run_forward_only():
  report = _run_job("tf_layer_norms")
  assert report["keras"] < 1e-5 and report["slim"] < 1e-5, report
