"""How the window's gradient reaches the optimizer inside the end-of-window
`tf.cond` (internal to estimator_accum).

Optimizers create slots while applying, and under a distribution strategy a
v1 optimizer all-reduces what it is given. Inside the window's branch the
first must happen outside the control flow and the second must not happen
at all: the window has already been all-reduced once. `apply_reduced` is
what the window calls.
"""

import contextlib

import tensorflow as tf

from estimator_accum import releases, tf_private


@contextlib.contextmanager
def outside_control_flow():
  """`tf.init_scope`, under the strategy of the replica being built.

  A strategy's scope is kept per graph and per thread: a replica's thread
  (MirroredStrategy builds each replica in one) has none in the outer
  graph (or in eager mode), so the strategy is entered there again.
  """
  strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
  with tf.init_scope():
    if strategy is None or tf.distribute.has_strategy():
      yield
    else:
      with strategy.scope():
        yield


def create_outside_control_flow(next_creator, **kwargs):
  """Variable creator that builds variables outside any cond branch.

  Optimizers such as BERT's AdamWeightDecay create their slots with
  `tf.compat.v1.get_variable` inside `apply_gradients`. Called from inside the
  end-of-window `tf.cond`, such a variable would be built in the branch (its
  own function graph under control flow v2); `init_scope` lifts it to the
  outer graph, as TensorFlow's own optimizers do for their slots.
  """
  with outside_control_flow():
    return next_creator(**kwargs)


@contextlib.contextmanager
def reduction_taken_out(optimizer):
  """While the window is handed to `optimizer` on every replica: a v1
  optimizer's cross-replica apply, reached through an `apply_gradients` of
  its own that calls the base class's, sums nothing.

  The window is already the mean over replicas on each of them. A v1
  optimizer whose `apply_gradients` (the base class's, reached from a
  subclass's) merges into `_distributed_apply` would sum the replicas' copies
  again; one whose `apply_gradients` never merges (google-research/bert's
  AdamWeightDecay updates each replica's copy of its variables in place) must
  see the whole mean. So every replica is given the mean, and the merge, if
  any, runs `_distributed_apply` with a strategy whose reduction hands the
  values back.
  """
  if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
    yield
    return
  with tf_private.distributed_apply_strategy(optimizer, AlreadyReduced):
    yield


def reduces_in_distributed_apply(optimizer):
  """Whether `optimizer` is a v1 optimizer that applies through the base
  class's `_distributed_apply` (its first step is the all-reduce); not one
  with its own `apply_gradients`, such as Google's AdamWeightDecay."""
  return tf_private.applies_through_distributed_apply(optimizer)


class AlreadyReduced:
  """A strategy whose `extended.batch_reduce_to` hands the values back.

  Everything else is the strategy's own: `_distributed_apply` then updates
  each replica's copy of every variable (and the slots) with that replica's
  component of the gradients, which the window's all-reduce made equal.
  """

  def __init__(self, strategy):
    self._strategy = strategy
    self.extended = ExtendedAlreadyReduced(strategy.extended)

  def __getattr__(self, name):
    return getattr(self._strategy, name)


class ExtendedAlreadyReduced:

  def __init__(self, extended):
    self._extended = extended

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
    del reduce_op, options
    return [value for value, _ in value_destination_pairs]

  def __getattr__(self, name):
    return getattr(self._extended, name)


def apply_reduced(cross_replica, optimizer, gradients, variables):
  """Cross-replica context: hands `optimizer` the window's gradients, already
  the same on every replica, for `variables`, with no second reduction;
  returns a True tensor after the apply.

  Args:
    cross_replica: the `replicas.CrossReplica` of the window's end.
    optimizer: a tf.compat.v1.train or Keras legacy optimizer.
    gradients: per-replica list of tf.Tensor or tf.IndexedSlices.
    variables: list of the trained variables, in the same order.
  """
  strategy = cross_replica.strategy
  if cross_replica.num_replicas > 1 and reduces_in_distributed_apply(
      optimizer):
    # A v1 optimizer would all-reduce the gradients again (a second round
    # of collectives per window, for nothing): run its cross-replica apply
    # with that reduction taken out; the gradients already are the mean.
    with tf.variable_creator_scope(create_outside_control_flow):
      apply_op = tf_private.distributed_apply(
          optimizer, AlreadyReduced(strategy), list(zip(gradients, variables)))
    with tf.control_dependencies([apply_op]):
      return tf.constant(True)

  def apply_on_replica(gradients):
    extra = {}
    # Already reduced: tell Keras not to reduce again.
    if isinstance(optimizer, releases.keras_legacy_optimizer_types()):
      extra = dict(experimental_aggregate_gradients=False)
    elif isinstance(optimizer, tf.keras.optimizers.Optimizer):
      extra = dict(skip_gradients_aggregation=True)
    # A v1 optimizer is given the whole mean too: reduction_taken_out.
    with tf.variable_creator_scope(create_outside_control_flow):
      apply_op = optimizer.apply_gradients(list(zip(gradients, variables)),
                                           **extra)
    with tf.control_dependencies([apply_op]):
      return tf.constant(True)

  with reduction_taken_out(optimizer):
    applied = cross_replica.each(apply_on_replica, gradients)
  with tf.control_dependencies(cross_replica.local(applied)):
    return tf.constant(True)
