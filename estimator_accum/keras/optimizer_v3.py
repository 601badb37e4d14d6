"""`AccumulatingKerasOptimizer` around a `tf.keras.optimizers.Optimizer`
(TensorFlow 2): a Keras optimizer of that kind itself, so that Keras treats
it as it treats the optimizer it wraps. Keras's `fit` writes an EMA's
averages into the model at its end (`finalize_variable_values`) for this
kind only, and `.keras` files save the state of this kind only.

Its state, as `variables` lists it and `.keras` files keep it: the
micro-batch count, the inner optimizer's variables (its update count,
learning rate and slots), then the window's state by name. A `.keras` file
is loaded before the window is built (Keras builds the optimizer's slots,
then sets their values): the window's values are kept by name and set when
the window is built, in the first step.
"""

import urllib.parse

import numpy as np
import tensorflow as tf

from estimator_accum.distribution import replicas
from estimator_accum.keras.optimizer import (
  AccumulatingKerasOptimizer,
  is_of_the_new_kind,
)

__all__ = ["AccumulatingKerasOptimizerV3"]

# The keys of a `.keras` file's window state: "window:" and the variable's
# name quoted (a key with "/" would be a folder of the file).
_WINDOW_KEY = "window:"


@tf.keras.utils.register_keras_serializable(package="estimator_accum")
class AccumulatingKerasOptimizerV3(AccumulatingKerasOptimizer,
                                   tf.keras.optimizers.Optimizer):
  """`AccumulatingKerasOptimizer` around a `tf.keras.optimizers.Optimizer`.

  Its `iterations` counts micro-batches; the inner optimizer's counts
  updates (its bias correction, learning-rate schedule, weight decay and
  EMA move once per window).
  """

  # No XLA: the window's tf.cond and all-reduce are built as they are.
  _KERAS_ARGUMENTS = {"jit_compile": False}
  _LEGACY_KIND = False

  @classmethod
  def takes(cls, optimizer):
    return is_of_the_new_kind(optimizer)

  def before_window(self, var_list):
    """Builds the inner optimizer's slots where Keras builds an optimizer's,
    in the step's replica context: under the strategy the step runs
    under (inside the window's branch, a replica's thread knows none)."""
    with tf.init_scope():
      self.build(var_list)

  def window_built(self):
    """Sets the state a SavedModel held, once the window's and the inner
    optimizer's state exist: once, in cross-replica context (every
    replica's thread builds the window and reaches here)."""
    state = self._window.keras.saved_model_state
    store = self._window.function_variables
    if state is None and not store.has_pending():
      return

    def load():
      with tf.init_scope():
        if state is not None:
          self.load_own_variables(state)
          self._window.keras.saved_model_state = None
        store.settle()

    replicas.once_across_replicas(load)

  def _take_saved_model_state(self, state):
    # Set in the first step, once the state is built (window_built).
    self._window.keras.saved_model_state = state

  def _state_by_key(self):
    """{key: variable}, keyed as in a `.keras` file."""
    own = [self.iterations] + list(self._window.inner_optimizer().variables)
    # The window's by its position and name ("window:<i>:<name>"): a
    # SavedModel loaded inside a strategy's scope names the state anew.
    return {**{str(i): variable for i, variable in enumerate(own)},
            **{f"{_WINDOW_KEY}{i}:{urllib.parse.quote(name, safe='')}":
               variable for i, (name, variable) in enumerate(
                   self._window.function_variables.saved().items())}}

  def build(self, var_list):
    """Builds the inner optimizer's state for `var_list` (Keras builds an
    optimizer before it loads a `.keras` file's values into it)."""
    self._window.inner_optimizer().build(var_list)

  @property
  def variables(self):
    """The micro-batch count, the inner optimizer's variables, then the
    window's state variables (those the first step made)."""
    return ([self.iterations] + list(self._window.inner_optimizer().variables)
            + list(self._window.function_variables.saved().values()))

  def save_own_variables(self, store):
    """Writes the state into a `.keras` file's `store`: the count and the
    inner optimizer's by position, the window's by name."""
    for key, variable in self._state_by_key().items():
      store[key] = variable.numpy()

  def load_own_variables(self, store):
    """Sets the state from a `.keras` file's `store`: the count and the
    inner optimizer's now (after `build`), the window's once it is built.

    Raises:
      ValueError: the file holds another number of optimizer variables.
    """
    keys = list(store.keys())
    own = [self.iterations] + list(self._window.inner_optimizer().variables)
    positional = [k for k in keys if not k.startswith(_WINDOW_KEY)]
    if len(positional) != len(own):
      raise ValueError(
          f"the file's optimizer state holds {len(positional)} values, this "
          f"AccumulatingKerasOptimizer's inner optimizer and micro-batch "
          f"count take {len(own)}: it was saved with another optimizer.")
    for i, variable in enumerate(own):
      replicas.assign_saved(variable, store[str(i)])
    window, order = {}, []
    for key in keys:
      if not key.startswith(_WINDOW_KEY):
        continue
      rest = key[len(_WINDOW_KEY):]
      index, colon, quoted = rest.partition(":")
      if colon and index.isdigit():
        name = urllib.parse.unquote(quoted)
        order.append((int(index), name))
      else:  # a file of an earlier version: by name only
        name = urllib.parse.unquote(rest)
      window[name] = np.asarray(store[key])
    self._window.function_variables.restore_later(
        window, [name for _, name in sorted(order)] if order else None)

  def get_slot_names(self):
    """The window's slot names, none while a SavedModel is saved."""
    if self._window.keras.saving_savedmodel:
      return []
    return super().get_slot_names()

  def finalize_variable_values(self, var_list):
    """At the end of `fit`: the inner optimizer's (an EMA's averages
    written into the model's variables)."""
    self._window.inner_optimizer().finalize_variable_values(var_list)
