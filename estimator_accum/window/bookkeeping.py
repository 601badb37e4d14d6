"""The window's fourth part: where the window is, and what it did.

`Bookkeeping` keeps the window's position (the global step, or a
between-graph worker's own count), the counters of updates applied and
windows skipped, the loss scale's update, the summaries and the progress
line, and the `AccumulationState` that hooks and tests read.
"""

import tensorflow as tf

from estimator_accum.window import reports, sharded
from estimator_accum.window.counters import WindowCounters
from estimator_accum.window.state import AccumulationState


class Bookkeeping:
  """Counts micro-batches and windows.

  Attributes:
    position: the variable counting this window's micro-batches: the
      global step, except in between-graph training, where the global step
      is shared by workers that each keep their own window and count their
      own micro-batches.
    state: the window's `AccumulationState`.
  """

  def __init__(self, plan, global_step, loss_scaler, progress, accumulators):
    """Makes the position (a worker's own) and the counters, after the
    window's sums; `progress`: the graph's `ProgressLine` or None."""
    self._plan = plan
    self._global_step = global_step
    self._loss_scaler = loss_scaler
    self._progress = progress
    self.position = global_step
    if plan.variables.local_device is not None:
      self.position = plan.variables(plan.name + "/local_micro_batches", [],
                                     tf.int64, per_replica=True)
    self._counters = WindowCounters(
        plan.name, plan.settings.max_consecutive_skipped_windows,
        plan.variables.shared())
    self.state = AccumulationState(
        plan.k, global_step, self._counters.updates_applied,
        self._counters.skipped_windows, self._counters.applied_gradient_norm,
        accumulators, loss_scaler.scale if loss_scaler else None)

  def state_variables(self):
    """The position (a worker's own) and the counters, in the order made."""
    own = [self.position] if self.position is not self._global_step else []
    return own + self._counters.state_variables()

  def count_window(self, applied, finite, norm, position):
    """The ops counting a window that was `applied` or skipped (a bool
    tensor), with global `norm`, ending at micro-batch `position`; and
    moving the loss scale and the reduction's state on."""
    ops = self._counters.count(applied, norm, position)
    if self._loss_scaler is not None:
      ops.append(self._loss_scaler.update(finite))
    return ops + self._plan.reduction.after_window()

  def count_micro_batch(self, cross_replica, status, done, position,
                        examples):
    """The ops counting the micro-batch, after the window's `status` and
    the micro-batch's work (`done`): the global step (and a worker's own
    position), the summaries, and the progress line when it is due."""
    if self._plan.settings.summaries:
      reports.add_summaries(status, self.state)
    with tf.control_dependencies([status, done]):
      counters = [self._global_step.assign_add(
          tf.constant(1, self._global_step.dtype.base_dtype),
          read_value=False)]
      if self._plan.sharded:
        counters.append(sharded.resumed_mid_window_check(
            self._plan.name, position, self._plan.k,
            self._plan.variables.shared()))
      if self.position is not self._global_step:
        counters.append(self.position.assign_add(
            tf.constant(1, tf.int64), read_value=False))
    if self._progress is not None:
      counters.append(self._progress_line(cross_replica, counters, position,
                                          examples))
    return counters

  def _progress_line(self, cross_replica, counters, position, examples):
    """The op writing the progress line, after the micro-batch's counters."""
    local = cross_replica.local(examples) if examples is not None else ()
    with tf.control_dependencies(counters):
      total = tf.constant(-1, tf.int64)
      if local:
        total = tf.add_n([tf.cast(e, tf.int64) for e in local])
      return self._progress.op(
          position + 1, self.state.updates_applied.read_value(),
          self.state.skipped_windows.read_value(), total, max(len(local), 1))
