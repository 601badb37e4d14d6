"""The window's state variables when the window is built inside a
tf.function (TensorFlow 2: Keras's `model.fit`, a custom `train_step`).

A tf.function may be traced more than once (Keras traces its train step
again for a batch of another size, such as an epoch's last), and each trace
builds the window anew; variables may only be made on the first trace.
`FunctionVariables`, owned by the optimizer wrapper, makes each state
variable once, outside the function (`tf.init_scope`, under the strategy
the trace runs under, as Keras makes optimizer slots), and hands the same
variable back to every later trace that asks for it by name. The window
asks for its variables as in a tf.compat.v1 graph (`state_variable`),
which, inside the wrapper's `building` scope, asks its `FunctionVariables`.
"""

import contextlib

import numpy as np
import tensorflow as tf

from estimator_accum import graph_state
from estimator_accum.distribution import apply, replicas


class FunctionVariables:
  """{name: variable} of the state a wrapper's window made in tf.functions.

  Attributes:
    made: {name: tf.Variable}, in the order made; sync-on-read variables
      (per replica) under a distribution strategy.
    untracked: names of the state that lives for one run only (not saved).
  """

  def __init__(self):
    self.made = {}
    self.untracked = set()
    # Values loaded (a `.keras` file) for state not made yet: {name: value},
    # and the names in the order the saving window made them (or None).
    self._pending = {}
    self._pending_order = None

  @contextlib.contextmanager
  def building(self):
    """The scope in which a window is built inside a tf.function: its
    state variables (`state_variable`) are made once, and the window may
    be built there."""
    stores = _Building.of(tf.compat.v1.get_default_graph()).stores
    stores.append(self)
    try:
      yield
    finally:
      stores.remove(self)

  def variable(self, name, shape, dtype, initializer, *, synchronization,
               aggregation, checkpointed):
    """The variable `name`: made now, outside the function, the first time
    it is asked for; the same variable every later time.

    Args: as `state_variable` gives them: the full name, the shape and
    dtype, an initializer (called with the shape and dtype), the
    tf.VariableSynchronization and tf.VariableAggregation, and whether it
    is saved (False: state for one run only)."""
    found = self.made.get(name)
    if found is not None:
      return found
    # Named exactly `name`, as in a tf.compat.v1 graph: not under the name
    # scope the window is built in.
    with apply.outside_control_flow(), tf.compat.v1.name_scope(None):
      variable = tf.Variable(
          lambda: initializer(shape, dtype), trainable=False, name=name,
          dtype=dtype, synchronization=synchronization,
          aggregation=aggregation)
    self.made[name] = variable
    if not checkpointed:
      self.untracked.add(name)
    elif name in self._pending:
      with tf.init_scope():
        variable.assign(self._pending.pop(name))
    return variable

  def saved(self):
    """{name: variable} of the state that is saved, in the order made."""
    return {name: variable for name, variable in self.made.items()
            if name not in self.untracked}

  def restore_later(self, values, order=None):
    """Sets {name: value} into the state: now where it is made, when it is
    made for the rest (`settle` sets or refuses what no name claimed).
    `order`: the names in the order the saving window made its state.

    Raises:
      ValueError: a value for state that was made and is not saved.
    """
    for name, value in values.items():
      if name in self.untracked:
        raise ValueError(f"window state {name!r} is not saved, and cannot be "
                         "restored.")
      if name in self.made:
        replicas.assign_saved(self.made[name], value)
      else:
        self._pending[name] = value
    if order is not None:
      self._pending_order = list(order)

  def has_pending(self):
    return bool(self._pending)

  def settle(self):
    """Once the window is built: sets the values no state of its name took,
    by position (the saving window made its state in the same order; Keras
    2.15 loads a SavedModel inside a strategy's scope with its variables
    named without their layers, and so the window's state too).

    Raises:
      ValueError: values that match no state of this window, in name nor
        in position and shape: the file was saved from another model.
    """
    if not self._pending:
      return
    saved = list(self.saved().items())
    order = self._pending_order
    if order is not None and len(order) == len(saved) and all(
        tuple(saved[i][1].shape) == np.shape(self._pending[name])
        for i, name in enumerate(order) if name in self._pending):
      for index, name in enumerate(order):
        if name in self._pending:
          replicas.assign_saved(saved[index][1], self._pending.pop(name))
    if self._pending:
      left = sorted(self._pending)
      self._pending = {}
      raise ValueError(
          f"the saved window state {left} matches no state of this window "
          f"by name, nor by position and shape (this window's: "
          f"{[name for name, _ in saved]}): it was saved from another model "
          "or another optimizer.")
    self._pending_order = None


class _Building:
  """What this module keeps per graph: the stores building there."""

  def __init__(self):
    self.stores = []

  @staticmethod
  def of(graph):
    return graph_state.owned("function_variables", _Building, graph)


def building_store():
  """The `FunctionVariables` building a window in the default graph (a
  tf.function's, or a control-flow branch of one), or None."""
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    stores = _Building.of(graph).stores
    if stores:
      return stores[-1]
    graph = getattr(graph, "outer_graph", None)
  return None


def building_in_function():
  """Whether a wrapper is building its window in the default graph, a
  tf.function's."""
  return building_store() is not None
