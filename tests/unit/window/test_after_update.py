"""after_update: ops a big-batch recipe runs after its train op every step
(an ExponentialMovingAverage of the weights, say) run once per applied
update, after it, and only then: equal to the recipe's, on one device and
under MirroredStrategy, with control flow v1 and v2; not for a skipped
window; bad values refused."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

v1 = tf.compat.v1.train
K = 4
MICRO_BATCH = 4
UPDATES = 3
REPLICAS = 2
# With num_updates n the decay is min(0.9, (1 + n) / (10 + n)): 0.18, 0.25,
# 0.31 over the first updates, so an average that counted micro-batches, or
# ran every micro-batch, would be far off.
DECAY = 0.9
_AVERAGE = "/ExponentialMovingAverage"


def _trained(estimator):
  names = support.weight_names()
  return {**{n: estimator.get_variable_value(n) for n in names},
          **{n + _AVERAGE: estimator.get_variable_value(n + _AVERAGE)
             for n in names}}


@pytest.mark.estimator
@pytest.mark.parametrize("replicas", [
    pytest.param(1, id="one"),
    pytest.param(REPLICAS, id="mirrored", marks=pytest.mark.slow)])
def test_moving_average_equals_the_big_batch_recipe(replicas, control_flow,
                                                    tmp_path):
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  big_batch = replicas * K * MICRO_BATCH
  data = support.make_data(big_batch * UPDATES)
  expected = support.reference_train(optimizer_fn, data, big_batch, UPDATES,
                                     ema_decay=DECAY)
  strategy = None
  if replicas > 1:
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(replicas)])
  estimator, _ = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
      train_distribute=strategy, ema_decay=DECAY)
  actual = _trained(estimator)
  what = f"moving average, {replicas} replica(s), {control_flow}"
  for name in support.weight_names():
    # Not vacuous: the average moved, and not onto the weights.
    assert not np.allclose(actual[name + _AVERAGE],
                           support.initial_weights()[name]), name
    assert not np.allclose(actual[name + _AVERAGE], actual[name]), name
  weights = {n: actual.pop(n) for n in support.weight_names()}
  support.assert_trained_like_big_batch(
      estimator, weights, {n: expected.pop(n) for n in weights},
      K * UPDATES, UPDATES, what)
  support.assert_weights_close(actual, expected, what=what)


@pytest.mark.estimator
def test_skipped_window_runs_no_update_ops(tmp_path):
  data = support.make_data(K * MICRO_BATCH * 2)
  data["x"][MICRO_BATCH + 1, 0] = np.nan  # The first window only.
  estimator, _ = support.estimator_train(
      tmp_path, lambda: v1.AdamOptimizer(0.05), data, MICRO_BATCH, K, K,
      ema_decay=DECAY, reportable_loss=True)
  assert estimator.get_variable_value(
      "gradient_accumulation/skipped_windows") == 1
  for name, start in support.initial_weights().items():
    np.testing.assert_allclose(
        estimator.get_variable_value(name + _AVERAGE), start, rtol=1e-6,
        err_msg=f"{name}'s average moved in a skipped window")


@pytest.mark.parametrize("value", [0.5, "ema", object()])
def test_after_update_that_is_not_callable(value):
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    with pytest.raises(TypeError) as raised:
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w * w), v1.AdamOptimizer(0.1), K, after_update=value)
  assert "after_update must be a callable with no arguments or None, got" in (
      str(raised.value))
