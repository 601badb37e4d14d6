"""Sharded accumulators: each of N replicas keeps 1/N of the window's sums.

With `accumulator_placement="sharded"` the window trades communication for
memory, as DeepSpeed's ZeRO-2 and accelerate's `sync_each_batch` do: every
micro-batch all-reduces its dense gradients (TensorFlow 2.15 has no
reduce-scatter collective on CPU; the all-reduce gives every replica the
whole sum, of which it keeps its slice), and each replica adds only its
slice, `ceil(size / N)` values of each variable, to a `ShardedAccumulator`.
The window's end gathers the slices (an all-gather, where the other sums
are all-reduced) into the window's sum: the window's gradient, check,
clipping and apply are the ordinary ones, exact against the big batch.

Tables with tf.IndexedSlices gradients keep their masked accumulators.

A sharded window lives in this run only: a checkpoint written mid-window
holds no usable slices (the saved sum of the slices mixes them), so a run
resumed mid-window fails its first micro-batch in one line instead of
training on a window that lost micro-batches. Checkpoints at the windows'
ends (`save_checkpoints_steps` a multiple of k, and `max_steps` too)
resume exactly.
"""

import math

import tensorflow as tf

from estimator_accum.checkpoints.state_variables import (
  unfolded_zeros,
  variable_base_name,
)
from estimator_accum.distribution import replicas


def check(num_replicas, reduction, local_device):
  """Raises ValueError where a sharded window cannot be exact."""
  if num_replicas < 2 or local_device is not None:
    raise ValueError(
        "accumulator_placement='sharded' splits the window among the "
        f"replicas of a collective strategy; this train op has "
        f"{num_replicas} replica(s)"
        f"{' on a parameter-server worker' if local_device else ''}. Use "
        "'device' (or 'host' on one replica).")
  if not reduction.weighs_replicas_alike:
    raise ValueError(
        "accumulator_placement='sharded' sums each micro-batch over the "
        "replicas before weighing it, which needs one weight for every "
        "replica: reduction='mean' without num_examples, or 'sum'.")


class ShardedAccumulator:
  """This replica's slice of one dense variable's window sum.

  Attributes:
    variable: the trained tf.Variable.
    total: the slice, `<var>/accum_shard`, float [ceil(size / replicas)].
    rows: None.
    kind: "sharded".
  """

  is_sparse = False
  is_compact = False
  kind = "sharded"
  rows = None

  def __init__(self, variable, dtype, num_replicas, variables):
    self.variable = variable
    self._replicas = num_replicas
    self._size = variable.shape.num_elements()
    self._slice = math.ceil(self._size / num_replicas)
    self.total = variables(
        variable_base_name(variable) + "/accum_shard", [self._slice], dtype,
        per_replica=True, slot_of=variable)

  def state_variables(self):
    return [self.total]

  def padded(self, gradient):
    """The micro-batch's `gradient` flat, in the accumulator's dtype,
    padded to replicas x slice: what the micro-batch's all-reduce sends."""
    flat = tf.reshape(tf.cast(gradient, self.total.dtype.base_dtype), [-1])
    return tf.pad(flat, [[0, self._slice * self._replicas - self._size]])

  def own_slice(self, reduced):
    """This replica's slice of the all-reduced `padded` gradient."""
    start = replicas.replica_id() * self._slice
    return reduced[start:start + self._slice]

  def add(self, gradient, weight):
    """Adds `weight` times this replica's slice (`own_slice`)."""
    dtype = self.total.dtype.base_dtype
    if weight is None:
      return self.total.assign_add(tf.cast(gradient, dtype), read_value=False)
    return tf.raw_ops.ResourceApplyGradientDescent(
        var=self.total.handle, alpha=-tf.cast(weight, dtype),
        delta=tf.cast(gradient, dtype))

  def reducible_sum(self, several):
    """(this replica's slice, None): the window's end gathers the slices of
    every replica (`joined`) instead of summing them."""
    del several
    return self.total.read_value(), None

  def joined(self, gathered):
    """The window's sum from every replica's slice, gathered in replica
    order (float [replicas x slice])."""
    return tf.reshape(gathered[:self._size], self.variable.shape)

  def reset(self):
    return self.total.assign(
        unfolded_zeros(self.total.shape, self.total.dtype.base_dtype),
        read_value=False)


def micro_batch_slices(accumulators, gradients, options):
  """Replica context: the gradients each accumulator adds, the sharded
  ones' replaced by this replica's slice of their sum over the replicas
  (one batched all-reduce)."""
  sharded = [i for i, a in enumerate(accumulators) if a.kind == "sharded"]
  reduced = replicas.sum_in_replica(
      [accumulators[i].padded(gradients[i]) for i in sharded], options)
  gradients = list(gradients)
  for i, value in zip(sharded, reduced):
    gradients[i] = accumulators[i].own_slice(value)
  return gradients


def resumed_mid_window_check(name, position, k, variables):
  """An op failing the first micro-batch of a run that starts inside a
  window: its slices were not saved."""
  started = variables(name + "/sharded_window_started", [], tf.bool,
                      per_replica=False, checkpointed=False)
  before = tf.cond(started.is_initialized(), started.read_value,
                   lambda: tf.constant(False))
  at_a_window_start = tf.equal(tf.math.floormod(position, k), 0)
  with tf.control_dependencies([tf.debugging.Assert(
      tf.logical_or(before, at_a_window_start),
      ["accumulator_placement='sharded': this run starts at micro-batch",
       position, f"inside a window of k={k}; a sharded window is not "
       "saved, so it cannot resume there. Save at the windows' ends "
       "(save_checkpoints_steps and max_steps multiples of k), or resume "
       "with accumulator_placement='device'."],
      name="sharded_window_resumed_mid_window")]):
    return started.assign(True, read_value=False)
