"""Batch normalization whose moving statistics follow the window, not the
micro-batch.

Plain BatchNorm updates its moving mean and variance on every micro-batch
from that micro-batch alone: with accumulation they take k steps of a
momentum average per update, over statistics of B examples instead of k·B
(measured in tests/test_batch_norm.py: after one window they differ from the
big batch's). `batch_norm` normalizes each micro-batch with its own
statistics, as any BatchNorm on a micro-batch must, and adds the micro-batch's
per-channel sums (its count times its mean, and times its mean square) to
window state kept like the accumulators: per replica, in the checkpoint. The
train op of `build_accumulating_train_op` ends that window with its own: it
all-reduces the sums together with the gradients (no extra round of
communication), moves the moving mean and variance once toward the mean and
population variance of every example the window saw, on every replica and
worker, and clears the sums. The moving statistics after a window then equal
one BatchNorm update on the concatenated batch, uneven micro-batches
included; a window skipped for a non-finite gradient moves nothing.

For users who keep a plain BatchNorm, `adjusted_momentum(momentum, k)` keeps
the averaging horizon the same in updates (momentum ** (1/k) per
micro-batch).
"""

import numpy as np
import tensorflow as tf

from estimator_accum import _checks, graph_state
from estimator_accum._autograph import as_written
from estimator_accum.checkpoints.state_variables import state_variable
from estimator_accum.distribution import replicas
from estimator_accum.distribution.placement import between_graph_worker_device


def adjusted_momentum(momentum, k):
  """Per-micro-batch momentum with the horizon of `momentum` per update."""
  k = _checks.check_k(k)
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
  return momentum ** (1.0 / k)


@as_written
def batch_norm(inputs, training, k, *, momentum=0.99, epsilon=1e-3,
               center=True, scale=True, name="batch_normalization"):
  """Batch normalization over all axes but the last, window-aware.

  ```python
  net = estimator_accum.batch_norm(net, mode == "train", k=4)
  ...
  train_op = estimator_accum.build_accumulating_train_op(loss, optimizer, 4)
  ```

  Args:
    inputs: float Tensor [..., channels].
    training: Python bool (or a boolean tensor whose value is known when the
      graph is built, e.g. `tf.constant(True)`): normalize with the
      micro-batch's statistics and add them to the window (True), or with
      the moving statistics (False). A tensor fed at run time is refused:
      build one graph per mode, as Estimator does.
    k: int >= 1, micro-batches per update, as given to
      `build_accumulating_train_op`.
    momentum: float in [0, 1), the moving averages' momentum per update.
    epsilon: float > 0 added to the variance.
    center, scale: whether to learn `beta` and `gamma`.
    name: variable scope; variables `<name>/{gamma,beta,moving_mean,
      moving_variance}` as in tf.compat.v1.layers, plus the window's
      `<name>/window_sum`, `<name>/window_square_sum` and
      `<name>/window_count`.

  Returns:
    The normalized Tensor, the dtype of `inputs`. In training, build the
    accumulating train op after every `batch_norm` layer in the graph: its
    window's end updates the moving statistics. The micro-batch's addition to
    the window runs before the output is produced (it is also in
    `tf.compat.v1.GraphKeys.UPDATE_OPS`, for code that runs those).

  Raises:
    TypeError, ValueError: for a bad `training`, `k`, `momentum`, `epsilon`
      or inputs without a known last dimension.
    ValueError: if the accumulating train op was already built in this graph.
    RuntimeError: in training, when called in cross-replica context.
  """
  training = _static_training(training)
  k = _checks.check_k(k)
  channels = _checked_channels(inputs, momentum, epsilon)
  axes = list(range(inputs.shape.rank - 1))
  with tf.compat.v1.variable_scope(name) as scope:
    gamma, beta, moving_mean, moving_variance = _layer_variables(
        channels, center, scale)
    x = tf.cast(inputs, tf.float32)
    if not training:
      return tf.cast(tf.nn.batch_normalization(
          x, moving_mean, moving_variance, beta, gamma, epsilon), inputs.dtype)
    statistics = _window_statistics(scope.name, k, momentum, moving_mean,
                                    moving_variance, x)
    mean, variance = tf.nn.moments(x, axes)
    count = tf.cast(tf.size(x, out_type=tf.int64) // channels, tf.float32)
    added = statistics.add(tf.stop_gradient(mean),
                           tf.stop_gradient(variance), count)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, added)
    output = tf.nn.batch_normalization(x, mean, variance, beta, gamma,
                                       epsilon)
    # The train op reads the window's sums after the gradients it adds,
    # which come after this output: so after this micro-batch's addition.
    with tf.control_dependencies([added]):
      return tf.identity(tf.cast(output, inputs.dtype))


def _checked_channels(inputs, momentum, epsilon):
  """The channels of `inputs` (its known last dimension), `momentum` and
  `epsilon` checked."""
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum!r}.")
  if not epsilon > 0:
    raise ValueError(f"epsilon must be > 0, got {epsilon!r}.")
  channels = inputs.shape[-1]
  if channels is None:
    raise ValueError(f"inputs must have a known last dimension, got shape "
                     f"{inputs.shape}.")
  return channels


def _layer_variables(channels, center, scale):
  """(gamma, beta, moving_mean, moving_variance) of the layer in the
  current variable scope, as tf.compat.v1.layers names them (gamma and
  beta None when not learned)."""
  def variable(var_name, init, trainable=False):
    return tf.compat.v1.get_variable(
        var_name, [channels], tf.float32, initializer=init,
        trainable=trainable)

  ones, zeros = (tf.compat.v1.ones_initializer(),
                 tf.compat.v1.zeros_initializer())
  return (variable("gamma", ones, trainable=True) if scale else None,
          variable("beta", zeros, trainable=True) if center else None,
          variable("moving_mean", zeros), variable("moving_variance", ones))


def _static_training(training):
  """`training` as a Python bool; TypeError unless it is known at build time."""
  value = training
  if isinstance(training, (tf.Tensor, tf.Variable)):
    value = tf.get_static_value(training)
    if value is None:
      raise TypeError(
          f"training must be a Python bool or a constant boolean tensor, got "
          f"{training!r}, whose value is only known at run time: the window's "
          "statistics are added only in training graphs. Build the graph for "
          "one mode (as Estimator does: mode == ModeKeys.TRAIN).")
  if isinstance(value, np.ndarray) and value.shape == ():
    value = value.item()
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"training must be a Python bool, got {training!r}.")
  return bool(value)


def _replica_id():
  """This replica's id in its sync group, as a Python int."""
  replica = replicas.replica_id()
  if replica is None:
    raise RuntimeError(
        "batch_norm in training must be called in replica context (a "
        "model_fn, or a function run by strategy.run), not in cross-replica "
        "context such as directly under strategy.scope().")
  return replica


class _Layers:
  """The graph's batch_norm windows (this module's graph state)."""

  def __init__(self):
    self.by_scope = {}
    # Set when the graph's first accumulating train op is built: layers
    # built later would have no train op to end their window.
    self.closed = False


def _layers(graph=None):
  return graph_state.owned("window_statistics", _Layers, graph)


def close_window_statistics():
  """Refuses batch_norm layers built from now on in this graph (the first
  accumulating train op is built)."""
  _layers().closed = True


def _window_statistics(scope, k, momentum, moving_mean, moving_variance,
                       inputs):
  """The layer's `WindowStatistics`, created by the first replica to build
  it and found by the others."""
  layers = _layers()
  if layers.closed:
    raise ValueError(
        f"batch_norm {scope!r} is built after build_accumulating_train_op: "
        "the train op updates the moving statistics of the batch_norm layers "
        "built before it. Build the model first, then the train op.")
  registry = layers.by_scope
  if scope not in registry:
    registry[scope] = WindowStatistics(
        scope, k, momentum, moving_mean, moving_variance,
        between_graph_worker_device(inputs, moving_mean))
  return registry[scope]


def window_statistics(graph=None):
  """The `WindowStatistics` of every batch_norm built in `graph` so far."""
  return list(_layers(graph).by_scope.values())


def claim_window_statistics(k, train_op_name):
  """The batch_norm windows the train op `train_op_name` ends, checked.

  Raises:
    ValueError: a layer was built with another k, or another accumulating
      train op already updates it.
  """
  claimed = window_statistics()
  for statistics in claimed:
    if statistics.k != k:
      raise ValueError(
          f"batch_norm {statistics.name!r} was built with k={statistics.k} "
          f"and build_accumulating_train_op with k={k}: give both the same "
          "k, the window's micro-batches.")
    if statistics.claimed_by not in (None, train_op_name):
      raise ValueError(
          f"batch_norm {statistics.name!r} is already updated by the "
          f"accumulating train op {statistics.claimed_by!r}; build one "
          "accumulating train op per graph.")
    statistics.claimed_by = train_op_name
  return claimed


class WindowStatistics:
  """One batch_norm layer's window: the sums its micro-batches add, which the
  accumulating train op reads, reduces, applies and clears at the window's
  end.

  Attributes:
    name: the layer's variable scope.
    k: the k the layer was built with.
    total: float32 [channels], sum over the window of count * mean, per
      replica (ON_READ, summed across replicas and in checkpoints).
    square_total: float32 [channels], sum of count * mean of squares.
    count: float32 scalar, the values per channel the window normalized.
    claimed_by: name of the accumulating train op that ends the window.
  """

  def __init__(self, name, k, momentum, moving_mean, moving_variance,
               local_device, sums=None):
    """`sums`: the (total, square_total, count) variables, made by their
    owner (a Keras layer); None to make them here."""
    self.name = name
    self.k = k
    self._momentum = momentum
    self._moving_mean = moving_mean
    self._moving_variance = moving_variance
    self._added = {}
    self.claimed_by = None
    if sums is not None:
      self.total, self.square_total, self.count = sums
      return
    shape = moving_mean.shape
    self.total = state_variable(name + "/window_sum", shape, tf.float32,
                                per_replica=True, local_device=local_device)
    self.square_total = state_variable(
        name + "/window_square_sum", shape, tf.float32, per_replica=True,
        local_device=local_device)
    self.count = state_variable(name + "/window_count", [], tf.float32,
                                per_replica=True, local_device=local_device)

  def add(self, mean, variance, count):
    """Replica context: adds one micro-batch of `count` values per channel
    with this `mean` and (population) `variance`; returns the op."""
    added = tf.group(
        self.total.assign_add(count * mean, read_value=False),
        self.square_total.assign_add(
            count * (variance + tf.square(mean)), read_value=False),
        self.count.assign_add(count, read_value=False),
        name="add_to_window")
    self._added[_replica_id()] = added
    return added

  def added_on_this_replica(self):
    """The op adding this replica's micro-batch (None if it has none)."""
    return self._added.get(_replica_id())

  def local_sums(self):
    """Replica context: this replica's (total, square_total, count)."""
    return [self.total.read_value(), self.square_total.read_value(),
            self.count.read_value()]

  def move_averages(self, cross_replica, sums):
    """Cross-replica context: moves the moving mean and variance once toward
    the window's, from `sums` (total, square_total, count over every
    replica). A layer whose sums are not finite, or empty, keeps its
    averages. Returns the op."""
    keep = 1.0 - self._momentum

    def move(average, total, square_total, count, of_variance):
      mean = total / count
      target = mean
      if of_variance:
        target = self._variance(square_total / count, mean)
      moved = average - keep * (average - target)
      valid = tf.logical_and(count > 0, tf.reduce_all(tf.math.is_finite(moved)))
      return average.assign(tf.where(valid, moved, average), read_value=False)

    return tf.group(*[
        cross_replica.update(average, move, tuple(sums) + (flag,))
        for average, flag in ((self._moving_mean, False),
                              (self._moving_variance, True))])

  @staticmethod
  def _variance(mean_square, mean):
    """The window's variance: the population variance of its values."""
    return tf.maximum(mean_square - tf.square(mean), 0.0)

  def reset(self):
    """Replica context: clears this replica's sums; returns the op."""
    return tf.group(*[
        variable.assign(tf.zeros_like(variable.read_value()), read_value=False)
        for variable in (self.total, self.square_total, self.count)])


class GhostWindowStatistics(WindowStatistics):
  """A window as Keras's ghost batch normalization (`virtual_batch_size` =
  the micro-batch) moves its averages at the batch of k micro-batches: once,
  toward the mean over the micro-batches of their means and of their
  (population) variances. `total` sums the means, `square_total` the
  variances, `count` the micro-batches."""

  def add(self, mean, variance, count):
    """Replica context: adds one micro-batch's per-channel `mean` and
    `variance` (`count`, its values per channel, is not used: each
    micro-batch counts once); returns the op."""
    del count
    added = tf.group(
        self.total.assign_add(mean, read_value=False),
        self.square_total.assign_add(variance, read_value=False),
        self.count.assign_add(tf.ones([], tf.float32), read_value=False),
        name="add_to_window")
    self._added[_replica_id()] = added
    return added

  @staticmethod
  def _variance(mean_square, mean):
    del mean
    return mean_square


@as_written
def keras_layer_window(name, k, momentum, moving_mean, moving_variance,
                       sums):
  """The `GhostWindowStatistics` of a Keras layer (`sums`: its variables)
  in the graph being built: made by the first replica to ask, found by the
  others, claimed by the accumulating train op built after it."""
  layers = _layers()
  if layers.closed:
    raise ValueError(
        f"layer {name!r} is called after the accumulating optimizer was: its "
        "moving statistics move at the end of the window of an optimizer "
        "called after it, in the same step.")
  if name not in layers.by_scope:
    layers.by_scope[name] = GhostWindowStatistics(
        name, k, momentum, moving_mean, moving_variance, None, sums=sums)
  return layers.by_scope[name]
