"""Compact accumulators for huge embedding tables.

Two words name the two ways a table with sparse (`tf.IndexedSlices`)
gradients is accumulated: *masked*, the default `Accumulator`, a dense sum
the size of the table plus a mask of the rows touched; and *compact*, this
module's `CompactSparseAccumulator`, the touched rows only.

A masked accumulator is cheap to add to (one scatter-add), but a
1,000,000 x 64 table costs 244 MB of accumulator whether a window
touches ten rows or all of them. A `CompactSparseAccumulator` keeps only the
rows the window touched: `<var>/accum_indices` (int64, one entry per row, each
row once) and `<var>/accum_values` (their summed gradients), both variables of
dynamic length that start empty. Each micro-batch finds its rows with
`tf.unique`, appends the rows not yet in the window and scatter-adds into the
values, so the state is always `rows touched x (row size + 8 bytes)`
and never more; the window's end hands the optimizer those rows as
`tf.IndexedSlices`, as the masked accumulator does.

This is what `SparseConditionalAccumulator` does, kept in ordinary resource
variables instead: they are saved in checkpoints (a job stopped mid-window
resumes it), work under control flow v1 and v2, and need no `take` that blocks
until enough gradients have arrived.

A variable gets a compact accumulator when its gradient is `tf.IndexedSlices`
and either the user asks for it (`sparse_accumulation=True`, or a list of
variables or names) or, by default, its masked accumulator would take at least
`sparse_threshold_bytes` (128 MB). Compact accumulators need one replica per
window: one device, or each worker of a parameter-server job. Under
MirroredStrategy and MultiWorkerMirroredStrategy the windows are all-reduced
with a fixed shape, so there tables are masked (and asked-for compact
accumulation is refused).
"""


import tensorflow as tf

from estimator_accum.checkpoints.state_variables import (
  StateVariables,
  variable_base_name,
)
from estimator_accum.window import progress

__all__ = ["CompactSparseAccumulator", "SPARSE_THRESHOLD_BYTES",
           "choose_compact"]

SPARSE_THRESHOLD_BYTES = 128 * 2**20


def _dynamic_rows_variable(name, row_shape, dtype, variables):
  """A non-trainable variable of shape [None] + row_shape, initially empty.

  `tf.compat.v1.get_variable` cannot make a variable whose first dimension is
  unknown (with `validate_shape=False` it still records the initial shape,
  and shape inference would then take the empty shape as fact).
  """
  graph = tf.compat.v1.get_default_graph()
  try:
    graph.get_operation_by_name(name)
  except KeyError:
    pass
  else:
    raise ValueError(
        f"variable {name!r} already exists: build_accumulating_train_op was "
        "called twice for the same variables in one graph. Build one train "
        "op per graph, or pass disjoint var_list values.")
  collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
  variables = variables or StateVariables()
  if variables.local_device is not None:
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
  with tf.compat.v1.name_scope(None), variables.on_worker():
    return tf.compat.v1.Variable(
        tf.zeros([0] + row_shape, dtype), trainable=False, name=name,
        shape=tf.TensorShape([None] + row_shape), use_resource=True,
        collections=collections)


class CompactSparseAccumulator:
  """Window state of a large table: only the rows the window touched.

  Attributes:
    variable: the trained tf.Variable (the table).
    indices: int64 variable `<var>/accum_indices`, shape [rows touched].
    values: variable `<var>/accum_values`, shape [rows touched] + row shape,
      the window's summed (weighted) gradient of those rows.
    is_sparse, is_compact: True.
    kind: "compact".
  """

  is_sparse = True
  is_compact = True
  kind = "compact"

  def __init__(self, variable, dtype, variables=None):
    self.variable = variable
    base = variable_base_name(variable)
    shape = variable.shape
    if not shape.is_fully_defined() or shape.rank < 1:
      raise ValueError(
          f"variable {base} has shape {shape}; compact sparse accumulation "
          "needs a table of static shape [rows, ...].")
    self._dense_shape = shape.as_list()
    row_shape = self._dense_shape[1:]
    self.indices = _dynamic_rows_variable(base + "/accum_indices", [],
                                          tf.int64, variables)
    self.values = _dynamic_rows_variable(base + "/accum_values", row_shape,
                                         dtype, variables)

  def state_variables(self):
    return [self.indices, self.values]

  def bytes_per_row(self):
    """Bytes the state takes per row touched (values + index)."""
    row = 1
    for size in self._dense_shape[1:]:
      row *= size
    return row * self.values.dtype.base_dtype.size + 8

  def add(self, gradient, weight):
    """Returns an op merging `weight * gradient`'s rows into the window.

    `tf.unique` over the window's indices and the new ones finds each row's
    place (old rows keep theirs, new rows are appended); the values grow by
    exactly the new rows and are scatter-added into. The sums are formed as
    the masked accumulator forms them, and the state never holds a row the
    window did not touch.
    """
    gradient = _as_slices(gradient, self.variable)
    dtype = self.values.dtype.base_dtype
    values = tf.cast(gradient.values, dtype)
    if weight is not None:
      values = values * weight
    indices = tf.cast(gradient.indices, tf.int64)
    held = self.indices.read_value()
    count = tf.shape(held)[0]
    unique, position = tf.unique(tf.concat([held, indices], 0))
    new_rows = tf.shape(unique)[0] - count
    zeros = tf.zeros(tf.concat([[new_rows], self._dense_shape[1:]], 0), dtype)
    # One copy of the state (grown by the new rows), added to in place: the
    # scatter forwards its input buffer, and the assign takes it over. No
    # scatter op touches the variable itself, which would switch it to
    # copy-on-read and make every later read copy the whole state.
    merged = tf.tensor_scatter_nd_add(
        tf.concat([self.values.read_value(), zeros], 0),
        tf.expand_dims(position[count:], 1), values)
    return tf.group(self.indices.assign(unique, read_value=False),
                    self.values.assign(merged, read_value=False))

  def reducible_sum(self, several):
    """(the window's rows, None): compact accumulators have one replica."""
    del several
    return self.window_sum(), None

  def decay(self, keep_fraction):
    """Returns an op that multiplies the window sum by `keep_fraction`."""
    return self.values.assign(self.values.read_value() * keep_fraction,
                              read_value=False)

  def window_sum(self):
    """The window's rows as tf.IndexedSlices (each row once, int64)."""
    return tf.IndexedSlices(self.values.read_value(),
                            self.indices.read_value(),
                            tf.constant(self._dense_shape, tf.int64))

  def reset(self):
    """Returns an op that empties the window (frees its rows)."""
    row_shape = self._dense_shape[1:]
    return tf.group(
        self.indices.assign(tf.zeros([0], tf.int64), read_value=False),
        self.values.assign(tf.zeros([0] + row_shape,
                                    self.values.dtype.base_dtype),
                           read_value=False))


def _as_slices(gradient, variable):
  if not isinstance(gradient, tf.IndexedSlices):
    raise TypeError(
        f"compact sparse accumulation of {variable_base_name(variable)} needs "
        f"tf.IndexedSlices gradients, got {type(gradient).__name__}.")
  return gradient


def _dense_bytes(variable, dtype):
  return variable.shape.num_elements() * dtype.size


def _named(sparse_accumulation, names, sparse):
  """Per trained variable (`names`, whose gradient is `sparse` or not),
  whether the list `sparse_accumulation` names it, checked: every item a
  variable or a name, of a trained variable with a sparse gradient."""
  wanted = set()
  for item in sparse_accumulation:
    if isinstance(item, str):
      wanted.add(item.split(":")[0])
    elif isinstance(item, tf.Variable) or hasattr(item, "name"):
      wanted.add(variable_base_name(item))
    else:
      raise TypeError(
          "sparse_accumulation must list tf.Variable objects or variable "
          f"names, got {item!r} in it.")
  unknown = sorted(wanted - set(names))
  if unknown:
    raise ValueError(
        f"sparse_accumulation names {unknown}, which are not trained "
        f"variables with a gradient; trained: {names}.")
  dense = sorted(n for n, s in zip(names, sparse) if n in wanted and not s)
  if dense:
    raise ValueError(
        f"sparse_accumulation names {dense}, whose gradients are dense "
        "tensors, not tf.IndexedSlices; only tables read with gather or "
        "embedding_lookup can be accumulated sparsely.")
  return [n in wanted for n in names]


def choose_compact(trained, sparse_accumulation, threshold_bytes, dtype,
                   num_replicas):
  """Decides, per trained variable, whether it gets a compact accumulator.

  Args:
    trained: list of (gradient, variable).
    sparse_accumulation: "auto", True, False, or a list/tuple/set of
      tf.Variable or variable names (with or without ":0").
    threshold_bytes: int >= 0 (checked by the option table); "auto" makes
      tables whose masked accumulator would take at least this many bytes
      compact.
    dtype: the accumulator tf.DType.
    num_replicas: replicas in sync; compact needs 1.

  Returns:
    list of bool, one per entry of `trained`.

  Raises:
    TypeError, ValueError: for a bad argument, naming it and its value.
  """
  sparse = [isinstance(g, tf.IndexedSlices) for g, _ in trained]
  names = [variable_base_name(v) for _, v in trained]
  if isinstance(sparse_accumulation, str):
    if sparse_accumulation != "auto":
      raise ValueError(
          "sparse_accumulation must be 'auto', True, False or a list of "
          f"variables or names, got {sparse_accumulation!r}.")
    chosen = [s and _dense_bytes(v, dtype) >= threshold_bytes
              for s, (_, v) in zip(sparse, trained)]
    if num_replicas > 1:
      for name, compact in zip(names, chosen):
        if compact:
          progress.log_info(
              "gradient accumulation: %s is above sparse_threshold_bytes but "
              "is accumulated masked: compact accumulation needs one "
              "replica, and there are %d.", name, num_replicas)
      return [False] * len(trained)
    return chosen
  if isinstance(sparse_accumulation, bool):
    chosen = sparse if sparse_accumulation else [False] * len(trained)
  elif isinstance(sparse_accumulation, (list, tuple, set, frozenset)):
    chosen = _named(sparse_accumulation, names, sparse)
  else:
    raise TypeError(
        "sparse_accumulation must be 'auto', True, False or a list of "
        f"variables or names, got {sparse_accumulation!r}.")
  if num_replicas > 1 and any(chosen):
    raise ValueError(
        f"sparse_accumulation={sparse_accumulation!r} asks for compact sparse "
        f"accumulators, which need one replica; this strategy has "
        f"{num_replicas} (use it with one device or parameter servers, or "
        "pass sparse_accumulation='auto' to accumulate masked here).")
  return chosen
