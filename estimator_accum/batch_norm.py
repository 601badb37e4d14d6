"""Batch normalization whose moving statistics follow the window, not the
micro-batch.

Plain BatchNorm updates its moving mean and variance on every micro-batch
from that micro-batch alone: with accumulation they take k steps of a
momentum average per update, over statistics of B examples instead of k·B
(measured in tests/test_batch_norm.py: after one window they differ from the
big batch's). `batch_norm` normalizes each micro-batch with its own
statistics, as any BatchNorm on a micro-batch must, but collects the window's
statistics and updates the moving averages once per window with the big
batch's values: the mean of the means, and the mean of the variances plus
the variance of the means (population variances, equal micro-batches). The
moving statistics after a window then equal one BatchNorm update on the
concatenated batch.

For users who keep a plain BatchNorm, `adjusted_momentum(momentum, k)` keeps
the averaging horizon the same in updates (momentum ** (1/k) per
micro-batch).
"""

import tensorflow as tf

from estimator_accum import _checks


def adjusted_momentum(momentum, k):
  """Per-micro-batch momentum with the horizon of `momentum` per update."""
  k = _checks.check_k(k)
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
  return momentum ** (1.0 / k)


def batch_norm(inputs, training, k, *, momentum=0.99, epsilon=1e-3,
               center=True, scale=True, global_step=None,
               name="batch_normalization"):
  """Batch normalization over all axes but the last, window-aware.

  Args:
    inputs: float Tensor [..., channels].
    training: Python bool: normalize with the micro-batch's statistics and
      collect them (True), or with the moving statistics (False).
    k: int >= 1, micro-batches per update, as given to
      `build_accumulating_train_op`.
    momentum: float in [0, 1), the moving averages' momentum per update.
    epsilon: float > 0 added to the variance.
    center, scale: whether to learn `beta` and `gamma`.
    global_step: the micro-batch counter; default the graph's global step.
    name: variable scope; variables `<name>/{gamma,beta,moving_mean,
      moving_variance}` as in tf.compat.v1.layers, plus the window's
      `<name>/window_mean` and `<name>/window_square`.

  Returns:
    The normalized Tensor, the dtype of `inputs`. In training the moving
    statistics' update is added to `tf.compat.v1.GraphKeys.UPDATE_OPS`: run
    it with the train op (`with tf.control_dependencies(update_ops):` around
    `build_accumulating_train_op`) so that it reads the micro-batch's
    `global_step` before the train op increments it.
  """
  k = _checks.check_k(k)
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
  if not epsilon > 0:
    raise ValueError(f"epsilon must be > 0, got {epsilon!r}.")
  channels = inputs.shape[-1]
  if channels is None:
    raise ValueError(f"inputs must have a known last dimension, got shape "
                     f"{inputs.shape}.")
  axes = list(range(inputs.shape.rank - 1))
  with tf.compat.v1.variable_scope(name):
    def variable(var_name, init, trainable=False):
      return tf.compat.v1.get_variable(
          var_name, [channels], tf.float32, initializer=init,
          trainable=trainable)

    ones, zeros = (tf.compat.v1.ones_initializer(),
                   tf.compat.v1.zeros_initializer())
    gamma = variable("gamma", ones, trainable=True) if scale else None
    beta = variable("beta", zeros, trainable=True) if center else None
    moving_mean = variable("moving_mean", zeros)
    moving_variance = variable("moving_variance", ones)
    x = tf.cast(inputs, tf.float32)
    if not training:
      return tf.cast(tf.nn.batch_normalization(
          x, moving_mean, moving_variance, beta, gamma, epsilon), inputs.dtype)
    window_mean = variable("window_mean", zeros)
    window_square = variable("window_square", zeros)
    mean, variance = tf.nn.moments(x, axes)
    output = tf.nn.batch_normalization(x, mean, variance, beta, gamma,
                                       epsilon)
    if global_step is None:
      global_step = tf.compat.v1.train.get_or_create_global_step()
    update = _window_update(
        tf.math.floormod(global_step.read_value(), k), k, momentum,
        tf.stop_gradient(mean), tf.stop_gradient(variance + tf.square(mean)),
        window_mean, window_square, moving_mean, moving_variance)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    return tf.cast(output, inputs.dtype)


def _window_update(position, k, momentum, mean, square, window_mean,
                   window_square, moving_mean, moving_variance):
  """Adds this micro-batch's mean and E[x^2]; at the window's end, moves the
  averages toward the window's mean and variance."""
  first = tf.equal(position, 0)
  sum_mean = tf.where(first, mean, window_mean.read_value() + mean)
  sum_square = tf.where(first, square, window_square.read_value() + square)
  stored = tf.group(window_mean.assign(sum_mean, read_value=False),
                    window_square.assign(sum_square, read_value=False))

  def end_window():
    big_mean = sum_mean / k
    big_variance = tf.maximum(sum_square / k - tf.square(big_mean), 0.0)
    return tf.group(
        moving_mean.assign_sub((1.0 - momentum) * (moving_mean - big_mean),
                               read_value=False),
        moving_variance.assign_sub(
            (1.0 - momentum) * (moving_variance - big_variance),
            read_value=False))

  with tf.control_dependencies([stored]):
    return tf.cond(tf.equal(position, k - 1), end_window, tf.no_op,
                   name="window_batch_norm_update")
