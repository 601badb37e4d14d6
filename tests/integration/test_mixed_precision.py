"""Loss scaling with accumulation: float16 and bfloat16 models (float32
variables), dynamic and fixed scales, MixedPrecisionLossScaleOptimizer, and
the wrong ways of combining them."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

v1 = tf.compat.v1
K, MICRO_BATCH = 2, 4
SCALE = "gradient_accumulation/loss_scale"
# float16 carries 11 significant bits; after a few updates the weights agree
# with float32 training to about this.
FP16_RTOL, FP16_ATOL = 2e-2, 2e-3


def _sgd():
  return v1.train.GradientDescentOptimizer(0.5)


def _train(tmp_path, data, windows, strategy=None, **params):
  return support.estimator_train(tmp_path, params.pop("optimizer_fn", _sgd),
                                 data, MICRO_BATCH, K, K * windows,
                                 train_distribute=strategy,
                                 reportable_loss=True, **params)


def _overflowing(data, window, replicas=1):
  """Data whose `window` has features float16 cannot hold (1e5 > 65504)."""
  data = {key: value.copy() for key, value in data.items()}
  size = replicas * K * MICRO_BATCH
  data["x"][window * size:(window + 1) * size] = 1e5
  return data


def _without_window(data, window, replicas=1):
  size = replicas * K * MICRO_BATCH
  return {key: np.concatenate([value[:window * size],
                               value[(window + 1) * size:]])
          for key, value in data.items()}


def _keras_wrapped_sgd():
  return tf.keras.mixed_precision.LossScaleOptimizer(
      tf.keras.optimizers.legacy.SGD(0.5))


@pytest.mark.estimator
@pytest.mark.parametrize("settings", [
    dict(loss_scale="dynamic"),
    # Keras's wrapper (default: dynamic from 2**15) is unwrapped the same way.
    dict(optimizer_fn=_keras_wrapped_sgd),
], ids=["loss_scale", "keras_wrapper"])
def test_float16_overflow_skips_its_window_and_halves_the_scale(tmp_path,
                                                                settings):
  data = _overflowing(support.make_data(K * MICRO_BATCH * 4), window=1)
  estimator, actual = _train(tmp_path, data, 4, compute_dtype=tf.float16,
                             **settings)
  assert estimator.get_variable_value(SCALE) == 2.0 ** 14
  assert estimator.get_variable_value(
      "gradient_accumulation/skipped_windows") == 1
  assert estimator.get_variable_value(
      "gradient_accumulation/updates_applied") == 3
  expected = support.reference_train(
      _sgd, _without_window(data, 1), K * MICRO_BATCH, 3)
  support.assert_weights_moved(actual, "float16")
  support.assert_weights_close(actual, expected, rtol=FP16_RTOL,
                               atol=FP16_ATOL, what="float16 dynamic")


@pytest.mark.estimator
def test_float16_small_gradients_need_the_scale(tmp_path):
  """Without scaling, float16 flushes gradients below 6e-8 to zero; the
  scaled run keeps them and tracks float32."""
  data = support.make_data(K * MICRO_BATCH * 3)

  def tiny_sgd():
    return v1.train.GradientDescentOptimizer(5e5)

  expected = support.reference_train(
      lambda: v1.train.GradientDescentOptimizer(5e5 * 1e-6),
      data, K * MICRO_BATCH, 3)

  # The loss is multiplied by 1e-6 through its scale below: gradients ~1e-8.
  def small_loss_params(loss_scale):
    return dict(compute_dtype=tf.float16, loss_scale=loss_scale,
                optimizer_fn=tiny_sgd, loss_multiplier=1e-6)

  _, scaled = _train(tmp_path / "scaled", data, 3,
                     **small_loss_params(2.0 ** 20))
  _, unscaled = _train(tmp_path / "unscaled", data, 3,
                       **small_loss_params(None))
  support.assert_weights_close(scaled, expected, rtol=FP16_RTOL,
                               atol=FP16_ATOL, what="float16 scaled")
  with pytest.raises(AssertionError):
    support.assert_weights_close(unscaled, expected, rtol=FP16_RTOL,
                                 atol=FP16_ATOL, what="float16 unscaled")


@pytest.mark.estimator
def test_scale_grows_after_good_windows_and_survives_a_restart(tmp_path):
  data = support.make_data(K * MICRO_BATCH * 5)

  def wrapped():
    return v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        v1.train.AdamOptimizer(0.05),
        v1.mixed_precision.DynamicLossScale(initial_loss_scale=8.0,
                                            increment_period=2))

  params = dict(optimizer_fn=wrapped, k=K, compute_dtype=tf.float32)
  whole = support.make_estimator(tmp_path / "whole", params)
  whole.train(support.micro_batch_input_fn(data, MICRO_BATCH),
              max_steps=K * 5)
  # Two doublings after 4 good windows; window 5 starts a new run.
  assert whole.get_variable_value(SCALE) == 32.0
  assert whole.get_variable_value("gradient_accumulation/good_windows") == 1

  stop = K * 3 + 1  # Mid-window, after the first doubling.
  first = support.make_estimator(tmp_path / "restart", params)
  first.train(support.micro_batch_input_fn(data, MICRO_BATCH),
              max_steps=stop)
  assert first.get_variable_value(SCALE) == 16.0
  second = support.make_estimator(tmp_path / "restart", params)
  second.train(support.micro_batch_input_fn(data, MICRO_BATCH, skip=stop),
               max_steps=K * 5)
  assert second.get_variable_value(SCALE) == 32.0
  for name in support.weight_names():
    np.testing.assert_array_equal(second.get_variable_value(name),
                                  whole.get_variable_value(name), name)
  # Scaling by powers of two is exact in float32: the big batch, to 1e-5.
  expected = support.reference_train(lambda: v1.train.AdamOptimizer(0.05),
                                     data, K * MICRO_BATCH, 5)
  support.assert_weights_close(
      {n: whole.get_variable_value(n) for n in support.weight_names()},
      expected, what="float32 with a loss-scale optimizer")


@pytest.mark.estimator
def test_keras_loss_scale_optimizer_settings_are_used(tmp_path):
  data = support.make_data(K * MICRO_BATCH * 5)

  def wrapped():
    return tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.Adam(0.05), initial_scale=8.0,
        dynamic_growth_steps=2)

  estimator, actual = _train(tmp_path, data, 5, optimizer_fn=wrapped,
                             compute_dtype=tf.float32)
  # Two doublings after 4 good windows; window 5 starts a new run.
  assert estimator.get_variable_value(SCALE) == 32.0
  assert estimator.get_variable_value(
      "gradient_accumulation/good_windows") == 1
  expected = support.reference_train(
      lambda: tf.keras.optimizers.legacy.Adam(0.05), data, K * MICRO_BATCH, 5,
      minimize=False)
  support.assert_weights_moved(actual, "keras wrapper")
  support.assert_weights_close(actual, expected,
                               what="float32 with a Keras loss-scale optimizer")


@pytest.mark.keras2
def test_keras_fixed_loss_scale_is_a_fixed_scale():
  with tf.Graph().as_default():
    _build(tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.SGD(0.1), dynamic=False,
        initial_scale=64.0))
    state = {v.op.name: v for v in v1.global_variables()}
    assert SCALE in state
    assert "gradient_accumulation/good_windows" not in state
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      assert session.run(state[SCALE]) == 64.0


@pytest.mark.estimator
def test_loss_scale_summary(tmp_path):
  data = support.make_data(K * MICRO_BATCH * 2)
  estimator, _ = _train(tmp_path, data, 2, loss_scale=4.0, summary_steps=100)
  tags = set()
  for path in tf.io.gfile.glob(str(tmp_path / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  assert "accumulation/loss_scale" in tags
  assert estimator.get_variable_value(SCALE) == 4.0


@pytest.mark.estimator
def test_bfloat16_model_tracks_float32(tmp_path):
  data = support.make_data(K * MICRO_BATCH * 3)
  _, actual = _train(tmp_path, data, 3, compute_dtype=tf.bfloat16)
  expected = support.reference_train(_sgd, data, K * MICRO_BATCH, 3)
  support.assert_weights_close(actual, expected, rtol=5e-2, atol=1e-2,
                               what="bfloat16")


@pytest.mark.estimator
def test_mirrored_float16_overflow_is_skipped_on_every_replica(tmp_path):
  replicas = 2
  data = _overflowing(support.make_data(replicas * K * MICRO_BATCH * 3),
                      window=2, replicas=replicas)
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(replicas)])
  estimator, actual = _train(tmp_path, data, 3, strategy=strategy,
                             compute_dtype=tf.float16, loss_scale="dynamic")
  assert estimator.get_variable_value(SCALE) == 2.0 ** 14
  expected = support.reference_train(
      _sgd, _without_window(data, 2, replicas), replicas * K * MICRO_BATCH, 2)
  support.assert_weights_close(actual, expected, rtol=FP16_RTOL,
                               atol=FP16_ATOL, what="mirrored float16")


def _build(optimizer, scaled_by=None, **kwargs):
  """Builds a train op in the default graph (the optimizer's: a Keras
  wrapper makes its scale variable when it is made).

  scaled_by: None, or a Keras loss-scale optimizer whose get_scaled_loss the
  loss goes through first (as in a Keras training loop).
  """
  import estimator_accum

  variable = v1.get_variable("w", initializer=1.0)
  loss = variable * 2.0
  if scaled_by is not None:
    loss = scaled_by.get_scaled_loss(loss)
  return estimator_accum.build_accumulating_train_op(
      loss, optimizer, 2, **kwargs)


def _keras_scaled_loss():
  optimizer = _keras_wrapped_sgd()
  return optimizer, {"scaled_by": optimizer}


@pytest.mark.keras2
@pytest.mark.parametrize("make, kwargs, error, text", [
    (lambda: v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        v1.mixed_precision.MixedPrecisionLossScaleOptimizer(_sgd(), 8.0),
        "dynamic"), {}, TypeError, "scaled twice"),
    (lambda: v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        _sgd(), "dynamic"), {"loss_scale": 128.0}, ValueError,
     "loss_scale=128.0 was given too"),
    (_keras_wrapped_sgd, {"loss_scale": "dynamic"}, ValueError,
     "LossScaleOptimizer and loss_scale='dynamic' was given too"),
    (_keras_scaled_loss, None, ValueError,
     "loss was scaled by the Keras LossScaleOptimizer's get_scaled_loss"),
    (lambda: tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.Adam(0.1)), {}, TypeError,
     "optimizer Adam is a Keras optimizer of the new kind"),
    (_sgd, {"loss_scale": 0}, ValueError, "loss_scale must be a finite "
     "number > 0, got 0"),
    (_sgd, {"loss_scale": "static"}, TypeError, "got 'static'"),
    (_sgd, {"loss_scale": True}, TypeError, "got True"),
])
def test_wrong_loss_scaling_is_refused(make, kwargs, error, text):
  with tf.Graph().as_default():
    optimizer = make()
    if kwargs is None:  # make returned (optimizer, kwargs).
      optimizer, kwargs = optimizer
    with pytest.raises(error, match=text):
      _build(optimizer, **kwargs)
