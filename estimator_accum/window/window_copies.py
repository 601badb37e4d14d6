"""A variable cast to a narrower dtype once a window, not each micro-batch.

A model whose products take bfloat16 (or float16) operands casts each
float32 weight every micro-batch: a pass over the model's weights (four
bytes read, two written a weight) k times a window, while the weights
change only when a window's update is applied. `cast_once_per_window(
variable, dtype)` gives that cast from a copy of the variable in `dtype`:
a local variable (never in a checkpoint) made from the variable when the
session starts (after a restore) and remade by the accumulating train op
after each update it applies. Its values are the cast's bit for bit, and
its gradient is the cast's: the narrow gradient cast back to the
variable's dtype.

The copies belong to the accumulating train op that takes its gradients
through them: `build_accumulating_train_op(loss, ...)`. A gradient taken
through a copy anywhere else (`optimizer.minimize`, `tf.gradients` handed
to the library as grads_and_vars) raises ValueError naming the variable,
since nothing would remake the copy and training would go on from stale
weights. Where a copy could be read by others than its own train op (under
a distribution strategy, a variable on another job's device: parameter
servers), and outside graph mode or inside a function, the call is the
plain cast.

A copy follows the variable through the train op's updates and session
starts only: a variable assigned by other ops inside a running session (a
hook restoring earlier weights into it) leaves its copy as it was until the
next update or session.
"""

import contextlib
import threading

import tensorflow as tf

from estimator_accum import graph_state
from estimator_accum.checkpoints.state_variables import variable_base_name
from estimator_accum.distribution import apply, replicas

_TAKING = threading.local()  # .name: the train op taking its gradients


class _Copy:
  """One variable's copy: `copy` (the local variable), `variable`, and the
  train op whose gradients went through it (None until one did)."""

  def __init__(self, copy, variable):
    self.copy = copy
    self.variable = variable
    self.claimed_by = None


def _copies(graph=None):
  """{(variable name, dtype): _Copy} of `graph` (default: the default
  graph), or of the graph holding it (a cond branch's function graph is
  the train op's graph's)."""
  graph = graph or tf.compat.v1.get_default_graph()
  while getattr(graph, "outer_graph", None) is not None:
    graph = graph.outer_graph
  return graph_state.owned("window_copies", dict, graph)


@contextlib.contextmanager
def gradients_of(train_op_name):
  """While the accumulating train op `train_op_name` takes its gradients
  of the loss: the copies they go through become its own."""
  before = getattr(_TAKING, "name", None)
  _TAKING.name = train_op_name
  try:
    yield
  finally:
    _TAKING.name = before


def _is_shared(variable):
  """True where others than the train op could read a copy: a strategy's
  replicas or workers, or a variable placed on another job's device."""
  return replicas.has_strategy() or "/job:" in (variable.device or "")


def cast_once_per_window(variable, dtype):
  """`tf.cast(variable, dtype)`, made once a window from a copy.

  For an accumulating train op's forward pass: the copy (a local variable,
  not checkpointed) is made from `variable` when the session starts and
  remade after each update the train op applies, so k micro-batches read
  it where each would cast the variable (see the module's docstring for
  where it is the plain cast).

  Args:
    variable: a float32 (or float64) tf.Variable trained by the accumulating
      train op built after this call with its loss.
    dtype: the narrower float dtype (tf.bfloat16, tf.float16).

  Returns:
    A Tensor of `dtype`, the variable's shape; its gradient reaches
    `variable` as the cast's.

  Raises:
    TypeError: `variable` is not a variable, or `dtype` not a float dtype.
    ValueError (when gradients are taken through it): by other than an
      accumulating train op given the loss.
  """
  if not isinstance(variable, tf.Variable):
    raise TypeError("cast_once_per_window: variable must be a tf.Variable, "
                    f"got {type(variable).__name__} {variable!r}")
  try:
    dtype = tf.as_dtype(dtype)
  except TypeError:
    raise TypeError(f"cast_once_per_window: dtype must be a float dtype, "
                    f"got {dtype!r}") from None
  if not dtype.is_floating:
    raise TypeError(f"cast_once_per_window: dtype must be a float dtype, "
                    f"got {dtype.name}")
  if dtype == variable.dtype.base_dtype:
    return tf.convert_to_tensor(variable)
  graph = tf.compat.v1.get_default_graph()
  if (tf.executing_eagerly() or graph.building_function or
      _is_shared(variable)):
    return tf.cast(variable, dtype)
  name = variable_base_name(variable)
  copies = _copies(graph)
  entry = copies.get((name, dtype))
  if entry is None:
    with graph.name_scope(name + "/"), tf.variable_creator_scope(
        apply.create_outside_control_flow), tf.init_scope():
      copy = tf.compat.v1.Variable(
          lambda: tf.cast(_current(variable), dtype),
          name=f"{dtype.name}_copy", trainable=False, use_resource=True,
          collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
    entry = copies[(name, dtype)] = _Copy(copy, variable)
  return _read(entry, tf.convert_to_tensor(variable),
               entry.copy.read_value())


def _current(variable):
  """The variable's value when the copy is made: read when initialized
  (restored, or initialized before), else its initial value (a session
  running the global and local initializers in one call: the same values
  the global one assigns, a warm start's included)."""
  return tf.cond(tf.compat.v1.is_variable_initialized(variable),
                 variable.read_value, lambda: variable.initial_value)


def _read(entry, value, copy):
  """The copy's value, with the cast's gradient to `value` (the variable
  read in this pass), claiming the copy for the train op taking it."""

  @tf.custom_gradient
  def read(value, copy):
    def gradient(narrow):
      _claim(entry)
      return tf.cast(narrow, value.dtype), None
    return tf.identity(copy), gradient

  return read(value, copy)


def _claim(entry):
  taker = getattr(_TAKING, "name", None)
  name = variable_base_name(entry.variable)
  if taker is None:
    raise ValueError(
        f"cast_once_per_window: a gradient through {name}'s "
        f"{entry.copy.dtype.base_dtype.name} copy was taken outside an "
        "accumulating train op: only build_accumulating_train_op given the "
        "loss remakes the copy after each update; without it training "
        "would read stale weights. Pass the loss to "
        "build_accumulating_train_op, or use tf.cast for other training.")
  if entry.claimed_by not in (None, taker):
    raise ValueError(
        f"cast_once_per_window: {name}'s copy is already remade by the "
        f"accumulating train op {entry.claimed_by!r}, not also by {taker!r}")
  entry.claimed_by = taker


def claimed(train_op_name):
  """True when gradients of the train op `train_op_name` went through a
  copy."""
  return any(entry.claimed_by == train_op_name
             for entry in _copies().values())


def remade(train_op_name):
  """The ops remaking the copies the train op `train_op_name` claimed,
  for after an update it applied ([] when none)."""
  return [entry.copy.assign(
      tf.cast(entry.variable.read_value(), entry.copy.dtype.base_dtype),
      read_value=False)
          for entry in _copies().values()
          if entry.claimed_by == train_op_name]
