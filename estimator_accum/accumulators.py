"""Accumulator variables: one per trained variable, named `<var>/accum`.

An `Accumulator` owns the window state of one variable and knows three things:
how to add one micro-batch's gradient (dense `assign_add`, or `scatter_add` for
`tf.IndexedSlices`), how to hand the window's sum back as a gradient of the same
kind the big batch would have produced, and how to reset itself.

Sparse gradients keep a row mask `<var>/accum_rows` beside the sum. The window
is handed to the optimizer as `tf.IndexedSlices` over exactly the rows its
micro-batches touched, because optimizers such as Momentum, RMSProp and Adadelta
update only the touched rows on a sparse gradient: a dense zero row would move
their slots and the result would no longer be the big batch.

All state variables are non-trainable, saved in checkpoints, and created with
`synchronization=ON_READ, aggregation=SUM`: under a distribution strategy each
replica adds to its own copy with no communication, and a checkpoint stores the
sum over replicas.
"""

import collections
import contextlib
import threading

import tensorflow as tf

from estimator_accum import graph_state
from estimator_accum.ordered_saves import order_saves

AccumulationState = collections.namedtuple(
    "AccumulationState",
    ["k", "global_step", "updates_applied", "skipped_windows",
     "applied_gradient_norm", "accumulators", "loss_scale", "examples"],
    defaults=[None])
AccumulationState.__doc__ = """What a built accumulation keeps, for hooks and tests.

Fields:
  k: int, micro-batches per update.
  global_step: the int64 variable counting micro-batches.
  updates_applied: int64 variable, windows applied so far.
  skipped_windows: int64 variable, windows skipped for NaN/Inf gradients.
  applied_gradient_norm: float32 variable, global norm of the last window's
    gradient (after the mean and the all-reduce, before clipping).
  accumulators: list of `Accumulator`, one per trained variable.
  loss_scale: float32 variable holding the loss scale, or None without loss
    scaling.
  examples: dict, replica id -> scalar tensor, for each replica on this
    worker: the examples in its micro-batch (`num_examples`, else the
    leading dimension of the input pipeline's batch), or None where that
    cannot be told. What `AccumulationLoggingHook` counts for examples/sec.
"""

_ON_READ = tf.VariableSynchronization.ON_READ
_SUM = tf.VariableAggregation.SUM
_MEAN = tf.VariableAggregation.MEAN
# Per thread (MirroredStrategy builds each replica in a thread of its own):
# the dicts `recording_state_variables` is filling.
_RECORDING = threading.local()


class StateRecording(dict):
  """{name: variable} of the window state variables made or reused in a
  thread; `slots` holds, by the same names, (trained variable's name, slot
  name) for the state that belongs to one trained variable (its
  accumulators), which object-based checkpoints key as the trained
  variable's optimizer slots."""

  def __init__(self):
    super().__init__()
    self.slots = {}


@contextlib.contextmanager
def recording_state_variables():
  """Yields a `StateRecording` that receives every window state variable
  made or reused in this thread while the context is open."""
  stack = _RECORDING.__dict__.setdefault("stack", [])
  found = StateRecording()
  stack.append(found)
  try:
    yield found
  finally:
    stack.remove(found)


def record_state_variable(name, variable, slot_of=None):
  """Hands `variable` to the recordings open in this thread; returns it.

  `slot_of`: the trained variable whose state `variable` is, named
  `<its name>/<suffix>`: recorded as its slot "window_<suffix>".
  """
  for found in getattr(_RECORDING, "stack", ()):
    found[name] = variable
    if slot_of is not None:
      base = variable_base_name(slot_of)
      found.slots[name] = (base, "window_" + name[len(base) + 1:])
  return variable


def _unfolded_zeros(shape, dtype=tf.float32, partition_info=None):
  """Initializer of zeros that Grappler cannot fold into a constant.

  `zeros_initializer` builds Fill(shape, 0), which Grappler folds into a
  Const node for tensors under its 10 MB limit; the cached initialization
  executor then keeps that constant alive for the whole session: a hidden
  extra copy of every accumulator (measured: 45 MB on BERT-Small). A zero
  scalar from `Empty(init=True)` is not a constant, so neither is the fill.
  """
  del partition_info
  zero = tf.raw_ops.Empty(shape=[], dtype=dtype, init=True)
  return tf.fill(shape, zero)


def variable_base_name(var):
  """Returns the strategy-wide name of `var` without the `:0` suffix.

  Under a distribution strategy `var.op.name` is the per-replica component
  (`.../replica_1`), which names no variable in replica 0; `var.name` is the
  name every replica shares.
  """
  return var.name.split(":")[0]


def replica_id():
  """The replica being built (an int), or None in cross-replica context."""
  context = tf.distribute.get_replica_context()
  return (None if context is None else
          int(tf.get_static_value(context.replica_id_in_sync_group)))


def state_variable(name, shape, dtype, *, per_replica, initial_value=None,
                   local_device=None, aggregation=_SUM, slot_of=None,
                   checkpointed=True):
  """Creates a non-trainable state variable with exactly `name`.

  Args:
    name: str, the full variable name (no enclosing variable scope is added).
    shape: the variable's shape.
    dtype: the variable's tf.DType.
    per_replica: bool. True for window state that each replica keeps for
      itself (ON_READ, summed when read across replicas); False for state
      shared by every replica (counters).
    initial_value: optional Python number; default zero.
    local_device: for between-graph (parameter-server) training, the
      worker's device: the variable is placed there and is a local variable
      (initialized by each worker, not shared, not checkpointed).
    aggregation: of a per-replica variable: SUM (a checkpoint holds the sum
      over replicas, and a restore gives each replica its share), or MEAN
      (the mean over replicas, restored whole to each: for values that are
      themselves means).
    slot_of: the trained variable whose state this is, if it is one's
      (its name is then `<that variable's name>/<suffix>`), else None.
    checkpointed: bool. False for state that lives for one run only: in
      no collection (neither saved, nor initialized by an initializer, nor
      counted among the window's state); the caller assigns it before it
      reads it.

  Returns:
    The variable, initialized to zeros (or initial_value).

  Raises:
    ValueError: if a variable with that name already exists in the graph,
      which means accumulation was built twice for the same variables.
  """
  # Jump to the root scope. Reuse only the variable another replica of this
  # worker created (MirroredStrategy runs the replicas after the first with
  # reuse=True, and they must find its variable), whatever the caller's
  # scope says: under a scope with reuse=True the first replica creates
  # its state, and under AUTO_REUSE a second build is refused, not handed
  # the first one's accumulators.
  creators = graph_state.of().state_creators
  replica = replica_id()
  reuse = name in creators and creators[name] != replica
  root = tf.compat.v1.VariableScope(reuse=reuse, name="")
  if not per_replica:
    aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
  extra = dict(aggregation=aggregation)
  if not checkpointed:
    # In no collection: no saver, no initializer, no readiness check sees
    # it; it is assigned before it is read (see Window._check_divergence).
    extra["collections"] = []
  elif local_device is not None:
    # A ParameterServerStrategy over several devices of a worker sums the
    # replicas' updates of a variable by its aggregation (a ps worker's
    # window is shared by its devices, as central storage's is).
    extra["collections"] = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
  elif per_replica:
    extra["synchronization"] = _ON_READ
  with tf.compat.v1.variable_scope(root, auxiliary_name_scope=False), \
      on_worker(local_device):
    try:
      variable = tf.compat.v1.get_variable(
          name, shape=shape, dtype=dtype, trainable=False,
          initializer=(_unfolded_zeros if initial_value is None else
                       tf.compat.v1.constant_initializer(initial_value)),
          use_resource=True,
          **extra)
      if creators.setdefault(name, replica) == replica and per_replica:
        order_saves(variable)
      if not checkpointed:
        return variable
      if slot_of is not None:
        graph_state.of().state_owners.setdefault(name, slot_of)
      return record_state_variable(name, variable, slot_of)
    except ValueError as error:
      if "already exists" not in str(error):
        raise
      owner = graph_state.of().state_owners.get(name)
      if slot_of is not None and owner is not None and owner is not slot_of:
        raise ValueError(
            f"the window state {name!r} of variable {slot_of.name} exists "
            f"already for another variable of that name ({owner.name}) in "
            "this graph: two models in one graph have variables of the same "
            "names (a Keras model loaded from a SavedModel into the graph "
            "of the model it was saved from keeps its layer names). Load or "
            "build the second model in a new graph or process, or name its "
            "layers otherwise.") from error
      raise ValueError(
          f"variable {name!r} already exists: build_accumulating_train_op was "
          "called twice for the same variables in one graph. Build one train "
          "op per graph, or pass disjoint var_list values.") from error


def between_graph_worker_device(computed, shared):
  """The worker's device in parameter-server (between-graph) training.

  Estimator places variables on the ps tasks and the rest on the worker
  (replica_device_setter), and so does a
  `tf.compat.v1.distribute.experimental.ParameterServerStrategy` given as
  `train_distribute`: a `shared` variable on a ps job and a `computed`
  tensor on another job mean each worker must keep its own window, on its
  own device. Returns None otherwise (one device, or another strategy).
  """
  if tf.distribute.has_strategy() and not isinstance(
      tf.distribute.get_strategy(),
      tf.compat.v1.distribute.experimental.ParameterServerStrategy):
    return None
  shared = tf.DeviceSpec.from_string(shared.device or "")
  here = tf.DeviceSpec.from_string(computed.device or "")
  if shared.job != "ps" or not here.job or here.job == "ps":
    return None
  return tf.DeviceSpec(job=here.job, replica=here.replica,
                       task=here.task).to_string()


@contextlib.contextmanager
def on_worker(local_device):
  """Places the variables created inside on `local_device`, if not None.

  Without a strategy, `tf.device` does it: it overrides the job of Estimator's
  ps placement function, which merges the op's device into its own. A
  ParameterServerStrategy instead creates every variable under its own ps
  placement, inside any device scope of the caller's; it honours one request
  only, the `colocate_with` a `colocate_vars_with` scope passes to its
  variable creator (which accepts only the strategy's own variables), so it
  is asked the same way to colocate with an op placed on the worker.
  """
  if local_device is None:
    # tf.device(None) would also drop the ps placement function.
    yield
    return
  if not tf.distribute.has_strategy():
    with tf.device(local_device):
      yield
    return
  with tf.device(local_device):
    anchor = tf.no_op(name="worker_state_placement")

  def colocate_with_worker(next_creator, **kwargs):
    kwargs["colocate_with"] = anchor
    return next_creator(**kwargs)

  with tf.compat.v1.variable_creator_scope(colocate_with_worker):
    yield


def _scatter(op, variable, indices, values):
  """Scatters into this replica's copy of `variable`.

  `SyncOnReadVariable.scatter_add` is not implemented, but in replica context
  `variable.handle` is this replica's own component, which the resource
  scatter ops update directly; for a plain variable it is the variable.
  """
  return op(resource=variable.handle, indices=indices,
            updates=tf.cast(values, variable.dtype.base_dtype))


def rows_to_slices(total, rows):
  """Returns the rows of `total` whose `rows` entry is > 0, as IndexedSlices.

  Args:
    total: float Tensor of shape [num_rows, ...], a window sum.
    rows: float32 Tensor of shape [num_rows], > 0 for the touched rows.
  """
  touched = tf.reshape(tf.where(rows > 0), [-1])
  return tf.IndexedSlices(tf.gather(total, touched), touched,
                          tf.shape(total, out_type=tf.int64))


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
  """

  is_compact = False

  def __init__(self, variable, gradient, dtype, local_device=None,
               holds_mean=False):
    """Creates the state for `variable`.

    Args:
      variable: the trained tf.Variable.
      gradient: a micro-batch gradient for `variable` (tf.Tensor or
        tf.IndexedSlices); its kind decides dense or sparse accumulation.
      dtype: tf.DType of the accumulator (float32 unless asked otherwise).
      local_device: the worker's device in between-graph training, where the
        state is kept as local variables; None otherwise.
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
    self.total = state_variable(
        base + "/accum", shape, dtype, per_replica=True,
        local_device=local_device, aggregation=(_MEAN if holds_mean else _SUM),
        slot_of=variable)
    self.rows = None
    if self.is_sparse:
      self.rows = state_variable(base + "/accum_rows", [shape[0]], tf.float32,
                                 per_replica=True, local_device=local_device,
                                 slot_of=variable)

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
    touched = tf.reshape(tf.where(self.rows.read_value() > 0), [-1])
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
          _unfolded_zeros(self.total.shape, self.total.dtype.base_dtype),
          read_value=False)
    touched = tf.reshape(tf.where(self.rows.read_value() > 0), [-1])
    row_shape = tf.concat([tf.shape(touched), tf.shape(self.total)[1:]], 0)
    clear_values = _scatter(tf.raw_ops.ResourceScatterUpdate, self.total,
                            touched, tf.zeros(row_shape))
    with tf.control_dependencies([clear_values]):
      return _scatter(tf.raw_ops.ResourceScatterUpdate, self.rows, touched,
                      tf.zeros_like(touched, dtype=tf.float32))
