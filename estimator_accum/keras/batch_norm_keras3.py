"""`WindowBatchNormalization` under Keras 3 (TensorFlow 2.16+'s default
`tf.keras`, TensorFlow backend), for a model trained with the Keras 3
`AccumulatingKerasOptimizer` (`keras/optimizer_keras3.py`).

Keras 3's BatchNormalization moves its moving mean and variance on every
micro-batch, and has no ghost batch normalization to compare a window
with. This layer is the Keras 2 layer's (`batch_norm.py`) under
Keras 3: it normalizes each micro-batch with its own statistics and adds
them to the window; the optimizer's window end moves the moving statistics
once, toward the mean over the window's micro-batches of their means and
of their (population) variances. That equals Keras 2's ghost batch
normalization, `BatchNormalization(virtual_batch_size=B)` at batch k x B.

Under a distribution strategy each replica adds its own share of each
micro-batch; the window's end sums every replica's sums and sets every
replica's copy of the moving statistics to the same value (Keras 3's own
layer lets the copies drift apart and reads the first replica's).

The optimizer finds the layers called in the same step: each layer records
itself in the step function's graph when it adds a micro-batch; run
eagerly, where there is no step graph, the optimizer takes the layers
recorded since its last micro-batch (another model's, trained in the same
process, were taken by that model's optimizer).
"""

import weakref

import keras
import tensorflow as tf

from estimator_accum import _checks, tf_private
from estimator_accum.keras.variables_keras3 import replica_sum

__all__ = ["WindowBatchNormalization", "windows_in_step"]

_UNSUPPORTED = ("synchronized", "renorm")

# {graph: {id(layer): layer}}: the layers that added a micro-batch in a
# step function's graph; run eagerly, those since the last `apply` took
# them.
_CALLED = weakref.WeakKeyDictionary()
_EAGER_CALLED = weakref.WeakValueDictionary()


@keras.saving.register_keras_serializable(package="estimator_accum")
class WindowBatchNormalization(keras.layers.BatchNormalization):
  """Keras 3's `BatchNormalization` whose moving statistics move once per
  window of the model's `AccumulatingKerasOptimizer`.

  Args:
    k: int >= 1, the optimizer's micro-batches per update.
    **kwargs: Keras 3's `BatchNormalization` arguments but `synchronized`
      and `renorm`.

  Raises:
    ValueError: `k` < 1, or an argument the window cannot honour.
  """

  def __init__(self, k, **kwargs):
    for name in _UNSUPPORTED:
      if kwargs.get(name):
        raise ValueError(
            f"WindowBatchNormalization does not take {name}={kwargs[name]!r}:"
            f" its micro-batches are normalized each on its own, and it "
            f"moves its averages once per window.")
    self.k = _checks.check_k(k)
    super().__init__(**kwargs)
    self.window_sums = None

  def build(self, input_shape):
    super().build(input_shape)
    shape = self.moving_mean.shape
    self.window_sums = (
        replica_sum(self, shape, "float32", "window_mean_sum"),
        replica_sum(self, shape, "float32", "window_variance_sum"),
        replica_sum(self, (), "float32", "window_micro_batches"))

  def call(self, inputs, training=None, mask=None):
    if not (training and self.trainable):
      return super().call(inputs, training=False, mask=mask)
    values = tf.cast(inputs, tf.float32)
    mean, variance = self._micro_batch_moments(values, mask)
    total, square_total, count = self.window_sums
    total.assign_add(tf.stop_gradient(mean))
    square_total.assign_add(tf.stop_gradient(variance))
    count.assign_add(1.0)
    _record(self)
    broadcast = [1] * values.shape.rank
    broadcast[self.axis] = values.shape[self.axis]

    def shaped(weight):
      return tf.reshape(tf.cast(weight, tf.float32), broadcast)

    outputs = tf.nn.batch_normalization(
        values, shaped(mean), shaped(variance),
        None if self.beta is None else shaped(self.beta),
        None if self.gamma is None else shaped(self.gamma), self.epsilon)
    return tf.cast(outputs, self.compute_dtype)

  def _micro_batch_moments(self, values, mask):
    """Per-channel mean and population variance of the micro-batch."""
    rank = values.shape.rank
    axes = [i for i in range(rank) if i != self.axis % rank]
    if mask is None:
      return tf.nn.moments(values, axes)
    # Keras's own masked moments, over the axes they read.
    self._reduction_axes = axes
    return self._moments(values, mask)

  def window_parts(self):
    """Replica context: this replica's (mean sum, variance sum, micro-batch
    count), read."""
    return [tf.identity(variable) for variable in self.window_sums]

  def end_window(self, sums):
    """Replica context: moves this replica's copy of the moving statistics
    once toward the window's, from `sums` (`window_parts` summed over every
    replica), and clears this replica's sums. A window with no micro-batch,
    or whose statistics are not finite, moves nothing."""
    total, square_total, count = sums
    keep = 1.0 - self.momentum
    for average, target in ((self.moving_mean, total / count),
                            (self.moving_variance, square_total / count)):
      local = tf_private.local_copy(average.value)
      moved = local - keep * (local - tf.cast(target, local.dtype))
      valid = tf.logical_and(count > 0, tf.reduce_all(tf.math.is_finite(moved)))
      local.assign(tf.where(valid, moved, local))
    for variable in self.window_sums:
      variable.assign(tf.zeros_like(variable))

  def get_config(self):
    return dict(super().get_config(), k=self.k)


def _record(layer):
  graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  called = _EAGER_CALLED if graph is None else _CALLED.setdefault(graph, {})
  called[id(layer)] = layer


def windows_in_step(k):
  """The `WindowBatchNormalization` layers that added a micro-batch in the
  step being built (the graph of the optimizer's `apply`, or one it is
  nested in), or, run eagerly, since the last call (which took them).

  Raises:
    ValueError: a layer was made with another k than the optimizer's.
  """
  if tf.executing_eagerly():
    layers = list(_EAGER_CALLED.values())
    _EAGER_CALLED.clear()
  else:
    graph, layers = tf.compat.v1.get_default_graph(), []
    while graph is not None and not layers:
      layers = list(_CALLED.get(graph, {}).values())
      graph = getattr(graph, "outer_graph", None)
  for layer in layers:
    if layer.k != k:
      raise ValueError(
          f"WindowBatchNormalization {layer.name!r} was made with "
          f"k={layer.k} and its AccumulatingKerasOptimizer with k={k}: give "
          f"both the same k, the window's micro-batches.")
  return layers
