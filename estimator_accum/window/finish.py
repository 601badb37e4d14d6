"""The window's third part: from the summed window to the optimizer.

`Finish` turns the window's sums over every replica into its gradient
(the reduction's finish: the mean, or the sum), its global norm and
whether it is finite, the clipping scale, and hands the optimizer the
result (`optimizer_apply.OptimizerApply`: in one native op a variable,
compiled by XLA with `fused_apply`, or TensorFlow's ops one variable at a
time). After an applied update it runs the user's `after_update`.
"""

import tensorflow as tf

from estimator_accum.distribution import apply
from estimator_accum.window import optimizer_apply
from estimator_accum.window.accumulators import rows_to_slices
from estimator_accum.window.gradient_ops import cast_gradient


class Finish:
  """Forms, clips and applies the window's gradient."""

  def __init__(self, plan, optimizer, accumulators):
    self._plan = plan
    self._settings = plan.settings
    self._accumulators = accumulators
    self._apply = optimizer_apply.OptimizerApply(plan, optimizer,
                                                 accumulators)

  # Replica context, inside the end-of-window branch.

  def window_gradients(self, sums, rows, weight):
    """The window's gradient on this replica, from sums over all replicas.

    Returns:
      (gradients, norm, finite, weight, scale): the list of window
      gradients (float32 tf.Tensor or tf.IndexedSlices with unique rows),
      their global norm before clipping (float32), whether that norm is
      finite, the window's weight over all replicas (None for the sum), and
      the scalar the gradients are to be multiplied by (clipping and the
      reduction's factor; None for 1), which `apply` applies in the apply's
      branch. A NaN or Inf anywhere in the window makes the norm
      non-finite, and every replica sees the same reduced values.
    """
    sums = [cast_gradient(_as_gradient(s, r, a.variable), tf.float32)
            for s, r, a in zip(sums, rows, self._accumulators)]
    gradients, factor = self._plan.reduction.finish(sums, weight)
    norm = tf.linalg.global_norm(gradients)
    if factor is not None:
      norm *= factor
    finite = tf.math.is_finite(norm)
    clip_norm = self._settings.clip_norm
    scale = factor
    if clip_norm is not None:
      # tf.clip_by_global_norm's scale, times the factor: one product per
      # gradient, which clipping makes anyway.
      clip_norm = tf.constant(clip_norm, norm.dtype)
      scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
      if factor is not None:
        scale *= factor
    return gradients, norm, finite, weight, scale

  # Cross-replica context, in the branch of a finite window.

  def apply(self, cross_replica, gradients, scale, moved):
    """The optimizer's update of every replica's copy, after `moved` (the
    batch_norm layers' moving statistics): `OptimizerApply.apply`."""
    return self._apply.apply(cross_replica, gradients, scale, moved)

  def after_update(self):
    """True branch: the user's `after_update` ops, once per applied update,
    after the micro-batch's work and counters (as a big-batch recipe's ops
    under `tf.control_dependencies([train_op])` run)."""
    with optimizer_apply.outer_name_scope(self._plan), tf.variable_creator_scope(
        apply.create_outside_control_flow):
      created = self._settings.after_update()
    created = [op for op in tf.nest.flatten(created) if op is not None]
    with tf.control_dependencies(created):
      return tf.no_op()


def _as_gradient(total, rows, variable):
  """A window sum as its variable's gradient: as it is; a dense table's
  sum by its row mask (float32 [rows]); or a block whose first rows are
  the sums of a table's touched rows, by their indices (int64 [rows
  touched])."""
  if rows is None:
    return total
  if rows.dtype == tf.int64:
    return tf.IndexedSlices(total[:tf.shape(rows)[0]], rows, tf.constant(
        variable.shape.as_list(), tf.int64))
  return rows_to_slices(total, rows)
