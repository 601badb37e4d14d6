"""estimator_accum.recompute inside the window under strategies and float16:
the model whose hidden layer is recomputed trains as the same model without
recomputation (1e-6) and as plain big-batch TensorFlow (1e-5), on
MirroredStrategy (2 logical CPUs) and MultiWorkerMirroredStrategy (2
processes from TF_CONFIG); in float16 with a dynamic loss scale, the same
windows are skipped and the weights are those without recomputation."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from harness import support

pytestmark = pytest.mark.slow

K, MICRO_BATCH, UPDATES, REPLICAS = 2, 4, 3, 2
BIG_BATCH = REPLICAS * K * MICRO_BATCH


def _adam():
  return tf.compat.v1.train.AdamOptimizer(0.05)


def _mirrored():
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(REPLICAS)])


def _assert_same(actual, expected, what):
  support.assert_weights_close(actual, expected, rtol=1e-6, atol=1e-7,
                               what=what)


@pytest.mark.estimator
def test_mirrored_recompute_equals_no_recompute_and_the_big_batch(tmp_path):
  data = support.make_data(BIG_BATCH * UPDATES)
  clip_norm = 0.5 * support.reference_gradient_norm(data, BIG_BATCH)
  runs = {}
  for recompute in (False, True):
    runs[recompute] = support.estimator_train(
        tmp_path / str(recompute), _adam, data, MICRO_BATCH, K, K * UPDATES,
        train_distribute=_mirrored(), clip_norm=clip_norm,
        recompute=recompute)
  expected = support.reference_train(_adam, data, BIG_BATCH, UPDATES,
                                     clip_norm=clip_norm)
  estimator, actual = runs[True]
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        K * UPDATES, UPDATES,
                                        "mirrored with recompute")
  _assert_same(actual, runs[False][1], "mirrored, recompute against none")


def _multiworker(tmp_path, *extra):
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(REPLICAS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(K),
      "--micro_batch", str(MICRO_BATCH), "--updates", str(UPDATES), *extra]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  saved = np.load(tmp_path / "final_weights.npz")
  return {n: saved[n.replace("/", "__")] for n in support.weight_names()}


@pytest.mark.estimator
def test_multiworker_recompute_equals_no_recompute_and_the_big_batch(
    tmp_path):
  from harness.multiworker_job import OPTIMIZERS
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  plain = _multiworker(tmp_path / "plain")
  actual = _multiworker(tmp_path / "recompute", "--recompute")
  support.assert_weights_moved(actual, "multi-worker recompute")
  support.assert_weights_close(actual, expected,
                               what="multi-worker with recompute")
  _assert_same(actual, plain, "multi-worker, recompute against none")


@pytest.mark.estimator
def test_float16_with_a_dynamic_scale_recomputes_as_it_computes(tmp_path):
  """Window 1 overflows in float16: skipped, the scale halved, with and
  without recomputation alike, to the same weights."""
  data = support.make_data(K * MICRO_BATCH * 4)
  data["x"][K * MICRO_BATCH:2 * K * MICRO_BATCH] = 1e5
  runs = {}
  for recompute in (False, True):
    runs[recompute] = support.estimator_train(
        tmp_path / str(recompute), _adam, data, MICRO_BATCH, K, K * 4,
        compute_dtype=tf.float16, loss_scale="dynamic", recompute=recompute,
        reportable_loss=True)
  for recompute, (estimator, _) in runs.items():
    assert estimator.get_variable_value(
        "gradient_accumulation/skipped_windows") == 1, recompute
    assert estimator.get_variable_value(
        "gradient_accumulation/loss_scale") == 2.0 ** 14, recompute
  support.assert_weights_moved(runs[True][1], "float16 recompute")
  _assert_same(runs[True][1], runs[False][1], "float16, recompute against none")
