"""The window's first part: its sums, each micro-batch added in place.

`Accumulation` makes the accumulators (of the kinds the plan chose, where
it placed them), the reduction's state, and claims the batch_norm layers'
window statistics; it adds each micro-batch on its own replica, reads this
replica's window at the window's end (before any communication), and
zeroes it after.
"""

import tensorflow as tf

from estimator_accum.checkpoints.state_variables import variable_base_name
from estimator_accum.distribution import replicas
from estimator_accum.window import (
  communication,
  optimizer_apply,
  reductions,
  sharded,
)
from estimator_accum.window.accumulators import Accumulator
from estimator_accum.window.batch_norm import claim_window_statistics
from estimator_accum.window.compact import CompactSparseAccumulator


def after(token):
  """A scope whose ops wait for `token`, taken in as data. Inside the
  window's tf.cond a data input reaches only the ops that use it, where a
  control input from outside the branch would hold back the whole branch
  (under control flow v2 it becomes a control input of the cond itself)."""
  return tf.control_dependencies([tf.identity(token)])


class _Unscaling:
  """A float32 weight (None for 1) divided by the loss scale, when the loss
  is scaled, as the accumulators' dtype: the gradients are unscaled in
  float32 as they enter the accumulators."""

  def __init__(self, loss_scaler, dtype):
    self._loss_scaler = loss_scaler
    self._dtype = dtype

  def __call__(self, weight):
    if self._loss_scaler is not None and self._loss_scaler.unscales:
      inverse = tf.cast(self._loss_scaler.inverse(), reductions.COUNT_DTYPE)
      weight = inverse if weight is None else weight * inverse
    return self.in_accumulator_dtype(weight)

  def in_accumulator_dtype(self, weight):
    return None if weight is None else tf.cast(weight, self._dtype)


class Accumulation:
  """The window's sums on each replica.

  Attributes:
    accumulators: one per trained variable, in the order of `trained`.
    statistics: the batch_norm layers' `WindowStatistics` this window
      updates.
  """

  def __init__(self, plan, trained):
    """Makes the window's sums for the plan's kinds: the accumulators (in
    this order, which the Keras wrapper's weights follow), then the
    reduction's state."""
    self._plan = plan
    self.statistics = claim_window_statistics(plan.k, plan.name)
    with plan.placement():
      self.accumulators = [self._accumulator(g, v, kind)
                           for (g, v), kind in zip(trained, plan.kinds)]
    plan.reduction.build(plan.name, plan.window_size, plan.variables)

  def _accumulator(self, gradient, variable, kind):
    plan = self._plan
    dtype = plan.settings.accumulator_dtype
    if kind == "compact":
      return CompactSparseAccumulator(variable, dtype, plan.variables)
    if kind == "sharded":
      return sharded.ShardedAccumulator(variable, dtype, plan.replicas,
                                        plan.variables)
    return Accumulator(variable, gradient, dtype, plan.variables,
                       holds_mean=plan.reduction.holds_mean)

  def state_variables(self):
    """(the accumulators' variables then the reduction's, in the order
    made; {name: (trained variable's name, "window_<suffix>")} of those
    that are one trained variable's state)."""
    slots = {}
    for accumulator in self.accumulators:
      base = variable_base_name(accumulator.variable)
      for variable in accumulator.state_variables():
        name = variable_base_name(variable)
        slots[name] = (base, "window_" + name[len(base) + 1:])
    made = [v for a in self.accumulators for v in a.state_variables()]
    return made + self._plan.reduction.state_variables(), slots

  # Replica context: every micro-batch.

  def add(self, gradients, loss_scaler):
    """The ops adding this micro-batch's `gradients` (each replica's own,
    or its slice of their sum for a sharded window): (added, own), the ops
    writing each accumulator, and those of the reduction's and the
    batch_norm layers' state."""
    added, own = self._plan.reduction.add(
        self.accumulators, gradients,
        _Unscaling(loss_scaler, self._plan.settings.accumulator_dtype))
    own += [op for op in (s.added_on_this_replica()
                          for s in self.statistics) if op]
    return added, own

  # Replica context, inside the end-of-window branch.

  def local_window(self, done, added):
    """This replica's window before any communication: (sums, rows, weight,
    statistics), the last the sums of each batch_norm layer's window.

    `sums` holds one tensor per variable, as the reduction's `local` gives
    them; `weight` is the replica's share of what the mean divides by (None
    for the sum). A table's sum on one replica is a tf.IndexedSlices and
    `rows` holds None; with several replicas it is the dense sum and its
    touched-row mask, so that the all-reduce has the same shapes on every
    replica (IndexedSlices are all-gathered, and their row counts differ);
    `finish.Finish` rebuilds the IndexedSlices afterwards. A table sent by
    its rows sends only its mask in this round: its dense sum is not read
    (a read of a table that scatter ops update copies it).

    Each accumulator is read once it holds the micro-batch (`added`, a
    bool tensor per accumulator), the rest once the micro-batch is `done`.
    """
    several = self._plan.replicas > 1
    sums, rows = [], []
    for accumulator, block, token in zip(self.accumulators,
                                         self._plan.rows_blocks, added):
      with after(token):
        total, mask = ((None, accumulator.rows.read_value()) if block
                       else accumulator.reducible_sum(several))
      sums.append(total)
      rows.append(mask)
    with after(done):
      local, weight = self._plan.reduction.local(
          [s for s in sums if s is not None])
      statistics = [s.local_sums() for s in self.statistics]
    local = iter(local)
    sums = [None if s is None else next(local) for s in sums]
    sums = communication.to_wire(sums, self._plan.wire)
    return sums, rows, weight, statistics

  def touched_rows(self, union, done):
    """This replica's sums of the rows in `union` ({table index: int64
    rows}), as the reduction's `local` forms sums, once the micro-batch is
    `done`, each in its table's block, on the wire."""
    with after(done):
      gathered = [self.accumulators[i].rows_of(union[i])
                  for i in sorted(union)]
      gathered, _ = self._plan.reduction.local(gathered)
    gathered = [communication.in_block(g, self._plan.rows_blocks[i])
                for g, i in zip(gathered, sorted(union))]
    return communication.to_wire(gathered, self._plan.wire)

  def reset(self, after_op):
    """Zeroes the window once `after_op` has run; a True tensor after."""
    sequential = self._plan.settings.sequential_apply
    with tf.control_dependencies([after_op]):
      compiled, rest = self._zeroed_in_place()
      resets = [compiled] if compiled is not None else []
      for accumulator in rest:
        # With sequential_apply, one after the other too: each reset makes
        # zeros the size of its accumulator.
        with tf.control_dependencies(resets[-1:] if sequential else []):
          resets.append(accumulator.reset())
      resets += [s.reset() for s in self.statistics]
      resets += self._plan.reduction.reset()
    with tf.control_dependencies(resets):
      return tf.constant(True)

  def _zeroed_in_place(self):
    """(op, the accumulators it does not zero). With fused_apply, where a
    compiled function can write the dense sums
    (`optimizer_apply.compiled_apart_because`: one replica of no strategy, its own task's device, resource
    variables), they are zeroed by one XLA-compiled function, which writes
    each in place: no buffer of zeros the size of an accumulator (what
    `assign(fill)` makes, one per accumulator, at the window's end, beside
    the optimizer's state). Else (None, all)."""
    dense = [a for a in self.accumulators if a.kind == "dense"]
    totals = [a.total for a in dense]
    if (not self._plan.settings.fused_apply or not totals or
        optimizer_apply.compiled_apart_because(
            replicas.alone(self._plan.replicas), (), totals,
            worker_device=self._plan.variables.local_device) is not None):
      return None, self.accumulators

    def zero_window():
      for total in totals:
        total.assign(tf.zeros(total.shape, total.dtype.base_dtype),
                     read_value=False)
      return tf.constant(True)

    zeroed = tf.function(zero_window, jit_compile=True, autograph=False)()
    return zeroed, [a for a in self.accumulators if a not in dense]
