"""A run whose windows keep being skipped stops, saying it diverged."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

v1 = tf.compat.v1


def _run(bad_micro_batches, micro_batches, k=2, **options):
  """Trains w on x * w with x fed per micro-batch (NaN at the given ones);
  returns (micro-batches run, the error that stopped it or None)."""
  with tf.Graph().as_default():
    x = v1.placeholder(tf.float32, [])
    w = v1.get_variable("w", [], initializer=v1.ones_initializer())
    train_op = estimator_accum.build_accumulating_train_op(
        x * w, v1.train.GradientDescentOptimizer(0.1), k,
        log_every_n_micro_batches=None, summaries=False, **options)
    with v1.Session() as session:
      session.run([v1.global_variables_initializer(),
                   v1.local_variables_initializer()])
      for step in range(micro_batches):
        value = np.nan if step in bad_micro_batches else 1.0
        try:
          session.run(train_op, {x: value})
        except tf.errors.OpError as error:
          return step, error
  return micro_batches, None


def test_consecutive_skipped_windows_stop_the_run():
  # k=2: windows end at micro-batches 1, 3, 5; each holds a NaN.
  step, error = _run({0, 2, 4}, 10, max_consecutive_skipped_windows=3)
  assert step == 5, "stopped at the end of the third skipped window"
  assert estimator_accum.is_divergence(error)
  assert "3 windows in a row were skipped" in str(error)
  assert "training diverged" in str(error)


def test_an_applied_window_starts_the_count_again():
  # Skipped, skipped, applied, skipped, skipped: never 3 in a row.
  step, error = _run({0, 2, 6, 8}, 10, max_consecutive_skipped_windows=3)
  assert error is None and step == 10


def test_none_never_stops():
  step, error = _run(set(range(40)), 40, max_consecutive_skipped_windows=None)
  assert error is None and step == 40


def test_the_default_stops_after_25():
  step, error = _run(set(range(60)), 60)
  assert estimator_accum.is_divergence(error)
  assert step == 2 * 25 - 1


def test_other_errors_are_not_divergence():
  assert not estimator_accum.is_divergence(ValueError("training diverged"))
  assert not estimator_accum.is_divergence(
      tf.errors.InvalidArgumentError(None, None, "shape mismatch"))


@pytest.mark.parametrize("value, error, text", [
    (0, ValueError, "max_consecutive_skipped_windows must be in 1..2147483648"
     " (or None to never stop), got 0."),
    (2.5, TypeError, "max_consecutive_skipped_windows must be an int or None,"
     " got 2.5 of type float."),
])
def test_bad_max_consecutive_skipped_windows(value, error, text):
  with pytest.raises(error) as raised:
    _run(set(), 1, max_consecutive_skipped_windows=value)
  assert str(raised.value) == text


def test_a_huge_k_is_one_clear_line():
  with pytest.raises(ValueError) as raised:
    _run(set(), 1, k=2**70)
  assert str(raised.value) == (
      "k must be at most 16777216 (2**24, the micro-batch counts are exact "
      "float32 up to there), got 1180591620717411303424.")
