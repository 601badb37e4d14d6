"""Accumulators of another dtype than float32, in real Estimator runs.

float64 accumulators are as exact as float32 ones; float16 and bfloat16
ones round every micro-batch's sum and stay within their precision of the
big batch. The window's counts stay float32 whatever the accumulators'
dtype, and under MultiWorkerMirroredStrategy the window's all-reduce sends
each dtype in packs of its own (a pack is concatenated).
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

v1 = tf.compat.v1.train
SETTINGS = {
    "mean": {},
    "running_mean": dict(reduction="running_mean"),
    "num_examples": dict(weight_by_examples=True),
}
# Largest error allowed, as a share of how far the weight moved in training.
SHARE_OF_MOVEMENT = {"float16": 0.02, "bfloat16": 0.1}


def _adam():
  return v1.AdamOptimizer(0.05)


def _assert_within_precision(actual, expected, dtype_name, what):
  start = support.initial_weights()
  support.assert_weights_moved(actual, what)
  for name in expected:
    moved = np.max(np.abs(expected[name] - start[name]))
    error = np.max(np.abs(actual[name] - expected[name]))
    assert error <= SHARE_OF_MOVEMENT[dtype_name] * moved, (
        f"{what}: {name} is {error:.2e} from the big batch, more than "
        f"{SHARE_OF_MOVEMENT[dtype_name]} of its movement {moved:.2e}")


@pytest.mark.estimator
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("dtype_name", ["float64", "float16", "bfloat16"])
def test_accumulator_dtype_against_big_batch(dtype_name, setting, tmp_path):
  data = support.make_data(48)
  expected = support.reference_train(_adam, data, 16, 3)
  estimator, actual = support.estimator_train(
      tmp_path, _adam, data, 4, 4, 12,
      accumulator_dtype=tf.as_dtype(dtype_name), **SETTINGS[setting])
  what = f"{dtype_name} accumulators, {setting}"
  if dtype_name == "float64":
    support.assert_trained_like_big_batch(estimator, actual, expected, 12, 3,
                                          what)
  else:
    _assert_within_precision(actual, expected, dtype_name, what)
  assert estimator.get_variable_value("dense/kernel/accum").dtype == (
      tf.as_dtype(dtype_name).as_numpy_dtype)


def test_counts_stay_exact_with_bfloat16_accumulators(capfd):
  """bfloat16 holds whole numbers only up to 256: a window of 260
  micro-batches must still count 260 of them (no straddling-window note,
  divisor 260, the count back to 0 after the window)."""
  k = 260
  graph = tf.Graph()
  with graph.as_default():
    weights = tf.compat.v1.get_variable(
        "w", [3], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_sum(tf.square(weights))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.GradientDescentOptimizer(0.1), k,
        accumulator_dtype=tf.bfloat16, summaries=False)
    state = estimator_accum.get_accumulation_state()
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    count = variables["gradient_accumulation/window_micro_batches"].read_value()
    divisor = variables["gradient_accumulation/window_divisor"].read_value()
    initializer = tf.compat.v1.global_variables_initializer()
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(initializer)
    for _ in range(k - 1):
      session.run(train_op)
    assert session.run(count) == k - 1
    session.run(train_op)
    assert session.run([count, divisor, state.updates_applied]) == [0, k, 1]
    # The window's mean gradient is 2 * 1: one step of SGD moves w to 0.8.
    np.testing.assert_allclose(session.run(weights), [0.8] * 3, rtol=1e-2)
  assert "micro-batches over all replicas" not in capfd.readouterr().err


@pytest.mark.estimator
@pytest.mark.slow  # a two-process cluster
def test_two_workers_with_float16_accumulators(tmp_path):
  """Their window mixes float16 sums with the float32 touched-row mask and
  count: one all-reduce per dtype (a single pack of both failed to
  concatenate)."""
  workers, k, micro_batch, updates = 2, 2, 4, 3
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(workers),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(k),
      "--micro_batch", str(micro_batch), "--updates", str(updates),
      "--accumulator_dtype", "float16"]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  big_batch = workers * k * micro_batch
  data = support.make_data(big_batch * updates)
  expected = support.reference_train(_adam, data, big_batch, updates)
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  _assert_within_precision(actual, expected, "float16",
                           "float16 accumulators on 2 workers")
