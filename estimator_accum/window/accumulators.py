"""Accumulator variables: one per trained variable, named `<var>/accum`.

An `Accumulator` owns the window state of one variable and knows three things:
how to add one micro-batch's gradient (dense `assign_add`, or `scatter_add` for
`tf.IndexedSlices`), how to hand the window's sum back as a gradient of the same
kind the big batch would have produced, and how to reset itself.

A variable with sparse gradients gets a *masked* accumulator: the dense sum
and a row mask `<var>/accum_rows` beside it (a *compact* one, the touched
rows only, is `compact.CompactSparseAccumulator`). The window
is handed to the optimizer as `tf.IndexedSlices` over exactly the rows its
micro-batches touched, because optimizers such as Momentum, RMSProp and Adadelta
update only the touched rows on a sparse gradient: a dense zero row would move
their slots and the result would no longer be the big batch.

Its variables are made by the build's `state_variables.StateVariables`.
"""

import tensorflow as tf

from estimator_accum import native
from estimator_accum.checkpoints.state_variables import (
  StateVariables,
  unfolded_zeros,
  variable_base_name,
)


def _scatter(op, variable, indices, values):
  """Scatters into this replica's copy of `variable`.

  `SyncOnReadVariable.scatter_add` is not implemented, but in replica context
  `variable.handle` is this replica's own component, which the resource
  scatter ops update directly; for a plain variable it is the variable.
  """
  return op(resource=variable.handle, indices=indices,
            updates=tf.cast(values, variable.dtype.base_dtype))


def touched_rows(mask):
  """int64 [rows touched]: the rows whose `mask` entry (float32 [num_rows])
  is > 0."""
  return tf.reshape(tf.where(mask > 0), [-1])


def rows_to_slices(total, rows):
  """Returns the rows of `total` whose `rows` entry is > 0, as IndexedSlices.

  Args:
    total: float Tensor of shape [num_rows, ...], a window sum.
    rows: float32 Tensor of shape [num_rows], > 0 for the touched rows.
  """
  touched = touched_rows(rows)
  return tf.IndexedSlices(tf.gather(total, touched), touched,
                          tf.shape(total, out_type=tf.int64))


def _one_pass_add(total, gradient, weight):
  """The op adding `weight` (None: 1) times `gradient` into the float32
  `total` in one pass where `gradient` is a bfloat16 or float16 tensor cast
  to float32 (a low-precision product's gradient reaching its float32
  variable), through identities (their control inputs kept): the native
  kernel reads the narrow tensor itself, and the cast, when nothing else
  reads it, is never computed. The same values bit for bit as the cast and
  the add. None where that does not apply or the kernels are not built."""
  if (not isinstance(gradient, tf.Tensor) or gradient.dtype != tf.float32
      or total.dtype.base_dtype != tf.float32):
    return None
  controls = []
  while gradient.op.type == "Identity":
    controls.extend(gradient.op.control_inputs)
    gradient = gradient.op.inputs[0]
  if gradient.op.type != "Cast":
    return None
  narrow = gradient.op.inputs[0]
  if narrow.dtype not in (tf.bfloat16, tf.float16):
    return None
  add = native.accumulate_op()
  if add is None:
    return None
  with tf.name_scope("one_pass_add"), tf.control_dependencies(controls):
    weight = (tf.ones([], tf.float32) if weight is None
              else tf.cast(weight, tf.float32))
    return add(total.handle, narrow, weight)


class Accumulator:
  """Window state of one trained variable.

  Attributes:
    variable: the trained tf.Variable.
    total: the accumulator variable `<var>/accum`, shape of `variable`.
    rows: for sparse gradients, a float32 variable `<var>/accum_rows` of shape
      [num_rows] holding 1.0 for every row touched in this window; else None.
    is_sparse: whether the gradients are tf.IndexedSlices.
    is_compact: False (see `CompactSparseAccumulator` for tables kept as
      the rows touched only).
    kind: "dense", or "masked" for sparse gradients (a dense sum and a row
      mask).
  """

  is_compact = False

  def __init__(self, variable, gradient, dtype, variables=None,
               holds_mean=False):
    """Creates the state for `variable`.

    Args:
      variable: the trained tf.Variable.
      gradient: a micro-batch gradient for `variable` (tf.Tensor or
        tf.IndexedSlices); its kind decides dense or sparse accumulation.
      dtype: tf.DType of the accumulator (float32 unless asked otherwise).
      variables: the build's `StateVariables` (None: a graph's).
      holds_mean: True when the sum holds a running mean (reduction
        "running_mean"): checkpoints then keep the mean over replicas, which
        a restore onto any number of replicas gives to each, so that with
        the micro-batch count (summed) it rebuilds the window's sum.
    """
    self.variable = variable
    self.is_sparse = isinstance(gradient, tf.IndexedSlices)
    base = variable_base_name(variable)
    shape = variable.shape
    if not shape.is_fully_defined():
      raise ValueError(
          f"variable {base} has shape {shape}, which is not fully defined; "
          "accumulators need a static shape.")
    variables = variables or StateVariables()
    self.total = variables(
        base + "/accum", shape, dtype, per_replica=True,
        aggregation=(tf.VariableAggregation.MEAN if holds_mean
                     else tf.VariableAggregation.SUM),
        slot_of=variable)
    self.kind = "masked" if self.is_sparse else "dense"
    self.rows = None
    if self.is_sparse:
      self.rows = variables(base + "/accum_rows", [shape[0]], tf.float32,
                            per_replica=True, slot_of=variable)

  def state_variables(self):
    """The variables holding this accumulator's window."""
    return [v for v in (self.total, self.rows) if v is not None]

  def add(self, gradient, weight):
    """Returns an op that adds `weight * gradient` to the window sum.

    Args:
      gradient: tf.Tensor or tf.IndexedSlices, one micro-batch's gradient.
      weight: scalar tensor of the accumulator dtype, or None for 1.
    """
    dtype = self.total.dtype.base_dtype
    if not self.is_sparse:
      one_pass = _one_pass_add(self.total, gradient, weight)
      if one_pass is not None:
        return one_pass
      value = tf.cast(tf.convert_to_tensor(gradient), dtype)
      if weight is None:
        return self.total.assign_add(value, read_value=False)
      # total += weight * value in place, with no temporary the size of the
      # variable: the gradient-descent kernel computes var - alpha * delta.
      return tf.raw_ops.ResourceApplyGradientDescent(
          var=self.total.handle, alpha=-tf.cast(weight, dtype), delta=value)
    values = tf.cast(gradient.values, dtype)
    if weight is not None:
      values = values * weight
    indices = gradient.indices
    add_values = _scatter(tf.raw_ops.ResourceScatterAdd, self.total, indices,
                          values)
    mark_rows = _scatter(tf.raw_ops.ResourceScatterUpdate, self.rows, indices,
                         tf.ones_like(indices, dtype=tf.float32))
    return tf.group(add_values, mark_rows)

  def reducible_sum(self, several):
    """(sum, rows): the window sum as `window_sum` gives it, rows None; or,
    for a table summed over `several` replicas, the dense sum and its
    touched-row mask, whose shapes are the same on every replica."""
    if self.is_sparse and several:
      return self.total.read_value(), self.rows.read_value()
    return self.window_sum(), None

  def rows_of(self, indices):
    """The window sum's rows `indices` (int64 [n]) of a table: [n] + row
    shape, gathered from the resource (no copy of the table)."""
    return tf.raw_ops.ResourceGather(
        resource=self.total.handle, indices=indices,
        dtype=self.total.dtype.base_dtype)

  def decay(self, keep_fraction):
    """Returns an op that multiplies the window sum by `keep_fraction`.

    Used by the running mean, which rescales the whole sum each micro-batch.
    """
    return self.total.assign(self.total * keep_fraction, read_value=False)

  def window_sum(self):
    """Returns the local window sum as the kind of gradient the variable gets.

    Returns:
      A tf.Tensor for dense variables; for sparse ones a tf.IndexedSlices with
      one row per row touched in the window (int64 indices).
    """
    if not self.is_sparse:
      return self.total.read_value()
    # Gather the touched rows from the resource itself: reading the whole
    # table (read_value) of a variable that scatter ops update makes
    # TensorFlow copy its entire buffer (copy-on-write).
    touched = touched_rows(self.rows.read_value())
    values = tf.raw_ops.ResourceGather(
        resource=self.total.handle, indices=touched,
        dtype=self.total.dtype.base_dtype)
    return tf.IndexedSlices(values, touched,
                            tf.constant(self.total.shape.as_list(), tf.int64))

  def reset(self):
    """Returns an op that clears the window state for the next window.

    Sparse accumulators zero only the rows the window touched, so a window
    over a large embedding table does not pay for the whole table. A dense
    sum is replaced by zeros Grappler cannot fold into a constant (a folded
    one would be a hidden copy of the variable held by the executor).
    """
    if not self.is_sparse:
      return self.total.assign(
          unfolded_zeros(self.total.shape, self.total.dtype.base_dtype),
          read_value=False)
    touched = touched_rows(self.rows.read_value())
    row_shape = tf.concat([tf.shape(touched), tf.shape(self.total)[1:]], 0)
    clear_values = _scatter(tf.raw_ops.ResourceScatterUpdate, self.total,
                            touched, tf.zeros(row_shape))
    with tf.control_dependencies([clear_values]):
      return _scatter(tf.raw_ops.ResourceScatterUpdate, self.rows, touched,
                      tf.zeros_like(touched, dtype=tf.float32))
