"""`WindowBatchNormalization`: Keras's BatchNormalization for a model
trained with `AccumulatingKerasOptimizer` (TensorFlow 2).

Keras's BatchNormalization moves its moving mean and variance on every
micro-batch it trains on: with k micro-batches per update they would move
k times per update, each time toward B examples' statistics. This layer
normalizes each micro-batch with its own statistics, as any batch
normalization of B examples does, and keeps the moving statistics for the
window's end, which moves them once.

"Exact" here means: the same as Keras's ghost batch normalization,
`BatchNormalization(virtual_batch_size=B)`, trained at batch k x B. Ghost
batch normalization normalizes each virtual batch of B with its own
statistics (as the micro-batches are) and moves the moving averages once
per step toward the mean over its virtual batches of their means and of
their variances (population variances, no Bessel correction; the variance
of the means is not added, by Keras's design). Under a distribution
strategy each replica does so with its own micro-batches, as each replica
of Keras's layer does with its virtual batches; the moving statistics read
(and saved) are the mean over replicas, as Keras's are. A window skipped
for a non-finite gradient moves nothing.

`estimator_accum.batch_norm` (graph mode) differs on purpose: it moves
toward the population statistics of all the window's examples, which one
BatchNorm at k x B would measure.
"""

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum._autograph import as_written
from estimator_accum.window.batch_norm import keras_layer_window

__all__ = ["WindowBatchNormalization"]

_UNSUPPORTED = ("virtual_batch_size", "renorm", "synchronized", "adjustment")


@tf.keras.utils.register_keras_serializable(package="estimator_accum")
class WindowBatchNormalization(tf.keras.layers.BatchNormalization):
  """`tf.keras.layers.BatchNormalization` whose moving statistics move once
  per window of the model's `AccumulatingKerasOptimizer`.

  ```python
  model = tf.keras.Sequential([
      tf.keras.layers.Conv2D(32, 3),
      estimator_accum.WindowBatchNormalization(k=4),
      ...])
  model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(1e-3), k=4), loss=...)
  ```

  Args:
    k: int >= 1, the optimizer's micro-batches per update.
    axis, momentum, epsilon, center, scale and the initializers,
      regularizers and constraints: as for Keras's layer (one axis).
    **kwargs: the other Keras layer arguments (name, dtype, ...).

  Raises:
    ValueError: `k` < 1, more than one axis, or an argument the window
      cannot honour (virtual_batch_size, renorm, synchronized, adjustment).
  """

  def __init__(self, k, **kwargs):
    _checks.check_keras_2("WindowBatchNormalization", "k", k)
    for name in _UNSUPPORTED:
      if kwargs.get(name):
        raise ValueError(
            f"WindowBatchNormalization does not take {name}={kwargs[name]!r}: "
            "its micro-batches are the virtual batches, and it moves its "
            "averages once per window.")
    self.k = _checks.check_k(k)
    kwargs["fused"] = False
    super().__init__(**kwargs)
    if not isinstance(self.axis, int) and len(self.axis) != 1:
      raise ValueError(f"WindowBatchNormalization normalizes over one axis, "
                       f"got axis={self.axis}.")
    self._window_sums = None

  def build(self, input_shape):
    super().build(input_shape)
    shape = self.moving_mean.shape

    def window_weight(name, weight_shape):
      return self.add_weight(
          name=name, shape=weight_shape, dtype=tf.float32,
          initializer="zeros", trainable=False,
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM,
          experimental_autocast=False)

    self._window_sums = (window_weight("window_mean_sum", shape),
                         window_weight("window_variance_sum", shape),
                         window_weight("window_micro_batches", []))

  @as_written
  def call(self, inputs, training=None):
    training = self._get_training_value(training)
    if training is False or (isinstance(training, bool) and not training):
      return super().call(inputs, training=False)
    if not isinstance(training, bool):
      raise TypeError(
          f"WindowBatchNormalization needs to know when the model is built "
          f"whether it trains, got training={training!r}.")
    ndims = inputs.shape.rank
    # (Keras's build leaves the axis a list of one non-negative index.)
    channel = self.axis[0]
    reduction_axes = [i for i in range(ndims) if i != channel]
    values = tf.cast(inputs, tf.float32)
    mean, variance = tf.nn.moments(values, reduction_axes, keepdims=True)
    broadcast = [1] * ndims
    broadcast[channel] = inputs.shape[channel]
    gamma = None if self.gamma is None else tf.reshape(
        tf.cast(self.gamma, tf.float32), broadcast)
    beta = None if self.beta is None else tf.reshape(
        tf.cast(self.beta, tf.float32), broadcast)
    outputs = tf.nn.batch_normalization(values, mean, variance, beta, gamma,
                                        self.epsilon)
    window = keras_layer_window(
        self.name, self.k, self.momentum, self.moving_mean,
        self.moving_variance, self._window_sums)
    added = window.add(tf.stop_gradient(tf.reshape(mean, [-1])),
                       tf.stop_gradient(tf.reshape(variance, [-1])), None)
    with tf.control_dependencies([added]):
      return tf.identity(tf.cast(outputs, inputs.dtype))

  def get_config(self):
    config = super().get_config()
    config["k"] = self.k
    config.pop("fused", None)
    return config
