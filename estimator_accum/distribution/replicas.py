"""Replica versus cross-replica context, the all-reduce, and variables each
replica keeps for itself: what the window asks of `tf.distribute`.

With no strategy, TensorFlow's default strategy answers: one replica, a
`merge` that is a plain call, an all-reduce that hands the values back.
"""

import collections

import tensorflow as tf

from estimator_accum import tf_private

# The class behind tf.distribute.experimental.CommunicationOptions, whose
# public name is a factory that isinstance cannot check against.
_COMMUNICATION_OPTIONS = type(tf.distribute.experimental.CommunicationOptions())


def has_strategy():
  """Whether a distribution strategy (other than the default) is entered."""
  return tf.distribute.has_strategy()


def alone(num_replicas_in_sync):
  """Whether `num_replicas_in_sync` replicas are the one replica of no
  distribution strategy (the default one): nothing to mirror, nothing to
  merge."""
  return num_replicas_in_sync == 1 and not has_strategy()


def num_replicas():
  """The replicas in sync under the current strategy (1 without one)."""
  return tf.distribute.get_strategy().num_replicas_in_sync


def strategy_name():
  """The current strategy's class name."""
  return type(tf.distribute.get_strategy()).__name__


def replica_id():
  """The replica being built (an int), or None in cross-replica context."""
  context = tf.distribute.get_replica_context()
  return (None if context is None else
          int(tf.get_static_value(context.replica_id_in_sync_group)))


def in_replica_context():
  """Whether the graph is being built in a replica's context."""
  return tf.distribute.get_replica_context() is not None


def in_a_replica_of_a_strategy():
  """Whether the graph is being built in one replica's context under a
  strategy (where a value cannot be set on every replica's copy)."""
  return has_strategy() and tf.distribute.in_cross_replica_context() is False


def is_multi_worker_collective(strategy=None):
  """Whether `strategy` (default: the current one) is a
  MultiWorkerMirroredStrategy, TF 2's or tf.compat.v1's."""
  strategy = strategy or tf.distribute.get_strategy()
  return isinstance(strategy, (
      tf.distribute.MultiWorkerMirroredStrategy,
      tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy))


def is_parameter_server():
  """Whether the current strategy is tf.compat.v1's ParameterServerStrategy."""
  return isinstance(tf.distribute.get_strategy(),
                    tf.compat.v1.distribute.experimental.ParameterServerStrategy)


def communication_options(options, default_bytes_per_pack):
  """The window all-reduce's options: `options`, checked, or packs of
  `default_bytes_per_pack`.

  Raises:
    TypeError: `options` is neither None nor CommunicationOptions.
  """
  if options is None:
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=default_bytes_per_pack)
  if not isinstance(options, _COMMUNICATION_OPTIONS):
    raise TypeError(
        f"communication_options must be a "
        f"tf.distribute.experimental.CommunicationOptions or None, got "
        f"{options!r} of type {type(options).__name__}.")
  return options


def sum_in_replica(values, options):
  """From replica context: the list `values` summed over every replica
  (one batched all-reduce per dtype), as the same list.

  Through merge_call, as the window's end sums: ReplicaContext.all_reduce
  in a graph registers a custom gradient for good, which kept the graph
  alive after its last user dropped it (measured: a sharded window's graph
  under MirroredStrategy was never freed)."""
  if not values:
    return []
  return merge(lambda cross_replica, flat: list(cross_replica.sum(
      flat, options)), list(values))


def sum_flags(values):
  """From replica context: the scalars `values` summed over every replica
  and worker in one small all-reduce (as given with one replica)."""
  if num_replicas() == 1:
    return list(values)
  return sum_in_replica(values, one_pack(
      tf.distribute.experimental.CommunicationOptions()))


def one_pack(options):
  """`options` with every tensor in one pack: for tensors whose sizes are
  known only at run time (packs of a given size need static sizes)."""
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=0, timeout_seconds=options.timeout_seconds,
      implementation=options.implementation)


def sync_on_read(aggregation):
  """The variable arguments of state each replica keeps for itself:
  updated locally with no communication, read across replicas (and saved)
  as their `aggregation` (a tf.VariableAggregation)."""
  return dict(synchronization=tf.VariableSynchronization.ON_READ,
              aggregation=aggregation)


def is_sync_on_read(variable):
  """Whether `variable` is a strategy's per-replica (ON_READ) variable."""
  return (isinstance(variable, tf.distribute.DistributedValues) and
          variable.synchronization == tf.VariableSynchronization.ON_READ)


def replica_components(variable):
  """(this worker's components of a distributed `variable`, whether those
  are all of its replicas)."""
  components = tuple(variable.values)
  replicas = tf_private.replicas_in_sync(variable)
  return components, replicas == len(components)


def assign_saved(variable, value):
  """Sets into `variable`, in cross-replica context, a `value` as it was
  saved: a per-replica variable as its replicas' sum (each replica gets its
  share) or mean (each gets it), as `SyncOnReadCheckpoint` restores it;
  any other as it is."""
  if not is_sync_on_read(variable):
    variable.assign(value)
    return
  components, _ = replica_components(variable)
  if variable.aggregation == tf.VariableAggregation.SUM:
    value = tf.cast(value / len(components), variable.dtype)
  for component in components:
    component.assign(value)


def saved_value(variable):
  """`variable`'s value as a checkpoint saves it (what `assign_saved` takes
  back): a per-replica variable's sum over its replicas (SUM) or their
  mean (MEAN), read from any context (outside its strategy's scope,
  `read_value` gives one replica's own); any other's value."""
  if not is_sync_on_read(variable):
    return variable.read_value()
  components, _ = replica_components(variable)
  total = tf.add_n([c.read_value() for c in components])
  if variable.aggregation == tf.VariableAggregation.SUM:
    return total
  return tf.cast(total / len(components), variable.dtype)


def once_across_replicas(function):
  """Runs `function()` once, in cross-replica context: from a replica's
  context under a strategy, where every replica calls this at the same
  point (a merge), else now."""
  if in_a_replica_of_a_strategy():
    tf.distribute.get_replica_context().merge_call(lambda _: function())
  else:
    function()


def mark_loss_mean_over_replicas():
  """Tells Estimator that the train op takes the mean over replicas, as
  `optimizer.minimize` tells it (TensorFlow's own flag on the graph, which
  Estimator reads), so that it reports the replicas' mean loss, not their
  sum. Set only when there are several replicas."""
  if num_replicas() > 1:
    tf_private.mark_loss_mean_over_replicas(tf.compat.v1.get_default_graph())


def in_each_replica_when(predicate, function, *args):
  """From replica context: `function(*args)` in each replica's own context
  when the scalar `predicate()` holds, `function` free to merge (an
  optimizer's apply). Where the strategy merges nothing, a cond right
  here; else the cond taken in cross-replica context and `function` run
  in each replica's context from there, as Keras 3's LossScaleOptimizer
  does (a cond in a replica's context may not hold a merge_call)."""
  if tf.__internal__.distribute.strategy_supports_no_merge_call():
    tf.cond(predicate(), lambda: _no_op_after(function, args), tf.no_op)
    return

  def across(strategy, *values):
    tf.cond(predicate(), lambda: _no_op_after(
        strategy.extended.call_for_each_replica, (function, values)),
            tf.no_op)

  tf.distribute.get_replica_context().merge_call(across, args=args)


def _no_op_after(function, args):
  function(*args)
  return tf.no_op()


def merge(function, *args):
  """From replica context: `function(cross_replica, *args)` once, in
  cross-replica context (`merge_call`), `cross_replica` a `CrossReplica`.
  Per-replica arguments arrive as per-replica values."""
  return tf.distribute.get_replica_context().merge_call(
      lambda strategy, *values: function(CrossReplica(strategy), *values),
      args=args)


class CrossReplica:
  """What cross-replica code needs of the strategy, and nothing more.

  Attributes:
    num_replicas: int, the replicas in sync.
  """

  def __init__(self, strategy):
    self._strategy = strategy
    self.num_replicas = strategy.num_replicas_in_sync

  @property
  def alone(self):
    """Whether this is the one replica of no distribution strategy (the
    default one): nothing to mirror, nothing to merge."""
    return alone(self.num_replicas)

  def each(self, function, *args):
    """`function(*args)` on every replica (in its replica context); returns
    the per-replica result."""
    return self._strategy.extended.call_for_each_replica(function, args=args)

  def local(self, value):
    """This worker's components of a per-replica `value`, as a tuple."""
    return tuple(self._strategy.experimental_local_results(value))

  def first(self, value):
    """The first local component of `value` (all are equal when it is the
    result of an all-reduce)."""
    return self.local(value)[0]

  def sum(self, structure, options):
    """Sums a nest of per-replica values (None entries kept) over all
    replicas: one batched all-reduce per dtype (one, unless the
    accumulators are not float32), since a pack is concatenated and its
    tensors share a dtype.

    Args:
      structure: a nest of per-replica values or None.
      options: tf.distribute.experimental.CommunicationOptions or None.

    Returns:
      The same nest, each value the sum over replicas (mirrored).
    """
    if self.num_replicas == 1:
      return structure
    flat = tf.nest.flatten(structure)
    by_dtype = collections.defaultdict(list)
    for i, value in enumerate(flat):
      if value is not None:
        by_dtype[self.first(value).dtype].append(i)
    for indices in by_dtype.values():
      reduced = self._strategy.extended.batch_reduce_to(
          tf.distribute.ReduceOp.SUM, [(flat[i], flat[i]) for i in indices],
          options=options)
      for i, value in zip(indices, reduced):
        flat[i] = value
    return tf.nest.pack_sequence_as(structure, flat)

  def gather(self, value):
    """A per-replica `value` of every replica, joined along axis 0 in
    replica order (an all-gather across workers), on this worker."""
    return self._strategy.gather(value, axis=0)

  def update(self, variable, function, args):
    """Runs `function(component, *args)` on each copy of a mirrored
    `variable`; returns the ops, grouped."""
    updates = self._strategy.extended.update(variable, function, args=args,
                                             group=False)
    return tf.group(*tf.nest.flatten(self.local(updates)))

  @property
  def strategy(self):
    """The strategy itself, for `apply.apply_reduced`."""
    return self._strategy
