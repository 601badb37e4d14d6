"""The window's counters: updates applied, windows skipped, the last norm,
and the windows skipped in a row that stop a diverged run."""

import tensorflow as tf

from estimator_accum.window import reports


class WindowCounters:
  """Counts what each window's end did (cross-replica context).

  Attributes:
    updates_applied: int64 variable, windows applied.
    skipped_windows: int64 variable, windows skipped for NaN/Inf.
    applied_gradient_norm: float32 variable, the last window's global norm
      (after the mean and the all-reduce, before clipping).
  """

  def __init__(self, name, max_consecutive_skipped_windows, variables):
    """`variables`: the build's `StateVariables` for shared state."""
    state_variable = variables
    self.updates_applied = state_variable(
        name + "/updates_applied", [], tf.int64, per_replica=False)
    self.skipped_windows = state_variable(
        name + "/skipped_windows", [], tf.int64, per_replica=False)
    self.applied_gradient_norm = state_variable(
        name + "/applied_gradient_norm", [], tf.float32, per_replica=False)
    self._max_skipped = max_consecutive_skipped_windows
    # The windows skipped in a row in this run (not saved: a resumed run
    # starts counting again); None when no number of them stops training.
    self._skipped_in_a_row = None
    if max_consecutive_skipped_windows is not None:
      self._skipped_in_a_row = state_variable(
          name + "/skipped_windows_in_a_row", [], tf.int64,
          per_replica=False, checkpointed=False)

  def state_variables(self):
    """The saved counters, in the order made."""
    return [self.updates_applied, self.skipped_windows,
            self.applied_gradient_norm]

  def count(self, applied, norm, position):
    """The ops counting a window that was `applied` (bool tensor) or
    skipped, with global `norm`, ending at micro-batch `position`."""
    ops = [
        self.updates_applied.assign_add(tf.cast(applied, tf.int64),
                                        read_value=False),
        self.skipped_windows.assign_add(
            tf.cast(tf.logical_not(applied), tf.int64), read_value=False),
        self.applied_gradient_norm.assign(norm, read_value=False),
    ]
    if self._skipped_in_a_row is not None:
      ops.append(self._check_divergence(applied, position))
    return ops

  def _check_divergence(self, applied, position):
    """Counts the windows skipped in a row; fails the step (an
    InvalidArgumentError saying `training diverged`) when they reach
    max_consecutive_skipped_windows."""
    counter = self._skipped_in_a_row
    # Not initialized by any initializer (it is in no collection): the
    # first window starts it.
    before = tf.cond(counter.is_initialized(), counter.read_value,
                     lambda: tf.constant(0, tf.int64))
    in_a_row = counter.assign(tf.where(
        applied, tf.constant(0, tf.int64), before + 1))
    return tf.debugging.Assert(
        in_a_row < self._max_skipped,
        [reports.diverged_message(self._max_skipped), position],
        name="diverged")
