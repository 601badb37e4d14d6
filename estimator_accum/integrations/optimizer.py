"""`AccumulatingOptimizer`: accumulation for code that calls a
`tf.compat.v1.train` optimizer itself.

Canned estimators (`tf.compat.v1.estimator.DNNRegressor(optimizer=...)`),
`tf_slim.learning.create_train_op` and other code written against
`tf.compat.v1.train.Optimizer` call `minimize`, or `compute_gradients` then
`apply_gradients`, themselves. Handing them `AccumulatingOptimizer` instead
of the optimizer gives the window of `build_accumulating_train_op`, with
nothing else changed. (`keras_optimizer.AccumulatingKerasOptimizer` is the
same for code that takes a Keras optimizer.)
"""

import tensorflow as tf

from estimator_accum._autograph import as_written
from estimator_accum.integrations.wrappers import (
  DEFAULT_NAME,
  WRAPPER_DEFAULTS,
  Wrapper,
  WrapperWindow,
  gradient_options,
  gradients_as_they_are,
)
from estimator_accum.options import (
  DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS,
  window_options,
)
from estimator_accum.window.compact import SPARSE_THRESHOLD_BYTES

__all__ = ["AccumulatingOptimizer"]


class AccumulatingOptimizer(Wrapper, tf.compat.v1.train.Optimizer):
  """An optimizer whose `minimize` and `apply_gradients` accumulate k
  micro-batches and apply `optimizer` once per window.

  For code that takes an optimizer and calls it itself:

  ```python
  optimizer = estimator_accum.AccumulatingOptimizer(
      tf.compat.v1.train.AdamOptimizer(1e-3), k=4, clip_norm=1.0)
  estimator = tf.compat.v1.estimator.DNNRegressor(
      hidden_units=[64], feature_columns=columns, optimizer=optimizer)
  ```

  `minimize(loss, global_step)` is `build_accumulating_train_op(loss,
  optimizer, k, global_step=global_step, ...)`: `global_step` counts
  micro-batches. Without a `global_step` (TensorFlow's optimizers then
  count nothing), a counter of the wrapper's own, `<name>/micro_batches`,
  counts them, and the graph's global step is left alone.

  `compute_gradients` returns one micro-batch's gradients as they are (not
  divided by the replicas, as a v1 optimizer's are under a strategy: the
  window divides by k and the replicas itself), and `apply_gradients` adds
  them to the window. Whatever the caller does in between applies to each
  micro-batch: clip with `clip_norm` here, which clips the window's gradient
  as the big batch's would be, not with the caller's per-gradient clipping.

  A loss summed over its batch (a canned estimator's default
  `loss_reduction=SUM`, or any `tf.compat.v1.losses` call with
  `Reduction.SUM`) is recognised as TensorFlow's optimizers recognise it, and
  the windows are summed (`reduction="sum"`) unless `reduction` says
  otherwise; a mean loss gives the mean over the window.

  Args:
    optimizer: the optimizer to apply once per window, as for
      `build_accumulating_train_op`.
    k: int >= 1, micro-batches per update.
    clip_norm, reduction, accumulator_dtype, accumulator_placement,
      summaries, loss_scale, sparse_accumulation, sparse_threshold_bytes,
      communication_options, table_all_reduce, communication_dtype,
      overlap_backward, sequential_apply, fused_apply, after_update,
      log_every_n_micro_batches, max_consecutive_skipped_windows, name: the
      window options, keyword-only, each documented with its check in
      `estimator_accum.options.OPTIONS` and in docs/user_guide.md
      ("Options").

  Here `reduction` defaults to None (the loss's own reduction, above),
  `name` to None (also this optimizer's name; a wide-and-deep estimator's
  two optimizers take "gradient_accumulation" and
  "gradient_accumulation_1"), and `loss_scale` needs `minimize`: it scales
  the loss.

  Raises:
    TypeError, ValueError: a bad argument, named, as
      `build_accumulating_train_op` raises them.
  """

  # What tells build_accumulating_train_op not to accumulate twice.
  accumulates_micro_batches = True
  # The defaults of the window options where they are not the table's.
  _OPTION_DEFAULTS = WRAPPER_DEFAULTS

  def __init__(
      self, optimizer, k, *,
      # The window options, in the order of the table (options.OPTIONS),
      # with the defaults of this wrapper (WRAPPER_DEFAULTS):
      clip_norm=None, reduction=None, accumulator_dtype=tf.float32,
      accumulator_placement="device", summaries=True, loss_scale=None,
      sparse_accumulation="auto",
      sparse_threshold_bytes=SPARSE_THRESHOLD_BYTES,
      communication_options=None, table_all_reduce="auto",
      communication_dtype=None, overlap_backward=True, sequential_apply=True,
      fused_apply=False,
      after_update=None, log_every_n_micro_batches=100,
      max_consecutive_skipped_windows=DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS,
      name=None):
    options = window_options(locals())
    self._window = WrapperWindow(optimizer, k, options)
    super().__init__(use_locking=False,
                     name=options.get("name") or DEFAULT_NAME)

  @as_written
  def minimize(self, loss, global_step=None, var_list=None,
               gate_gradients=tf.compat.v1.train.Optimizer.GATE_OP,
               aggregation_method=None, colocate_gradients_with_ops=False,
               name=None, grad_loss=None):
    """Returns the train op of one micro-batch of `loss`: run it once per
    micro-batch. `name` is not used: the ops are named by the optimizer's
    name. Other arguments as for `tf.compat.v1.train.Optimizer.minimize`."""
    del name  # The window's scope is this optimizer's name.
    return self._window.train_op(
        self, global_step, loss=loss, var_list=var_list,
        gradient_options=gradient_options(
            gate_gradients, aggregation_method, colocate_gradients_with_ops,
            grad_loss))

  @as_written
  def compute_gradients(self, loss, var_list=None,
                        gate_gradients=tf.compat.v1.train.Optimizer.GATE_OP,
                        aggregation_method=None,
                        colocate_gradients_with_ops=False, grad_loss=None):
    """Returns [(gradient, variable)] of one micro-batch's `loss`, not
    divided by the number of replicas (the window does that). Arguments as
    for `tf.compat.v1.train.Optimizer.compute_gradients`."""
    return gradients_as_they_are(loss, var_list, gradient_options(
        gate_gradients, aggregation_method, colocate_gradients_with_ops,
        grad_loss))

  @as_written
  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Returns the train op that adds one micro-batch's `grads_and_vars` (from
    `compute_gradients`) to the window, and applies the window at its k-th
    micro-batch. `global_step` as for `minimize`; `name` is not used."""
    del name  # The window's scope is this optimizer's name.
    return self._window.train_op(self, global_step,
                                 grads_and_vars=grads_and_vars)

  def variables(self):
    """The inner optimizer's variables, then the window's state variables
    in this graph (its accumulators and counters)."""
    return (list(self._window.optimizer.variables()) +
            self._window.checkpoints.variables())
