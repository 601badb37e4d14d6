"""`AccumulatingKerasOptimizer` around a legacy Keras optimizer
(`tf.keras.optimizers.legacy`) or a `tf.compat.v1.train` one: a legacy
Keras optimizer itself, whose weights (`get_weights`, `.h5` files,
SavedModels) hold the micro-batch count, the inner optimizer's weights and
the window's state.

Imported by `estimator_accum` (AccumulatingKerasOptimizer makes this kind
for such an optimizer).
"""

import numpy as np
import tensorflow as tf

from estimator_accum._autograph import as_written
from estimator_accum.distribution import replicas
from estimator_accum.integrations.wrappers import gradients_as_they_are
from estimator_accum.keras.optimizer import (
  AccumulatingKerasOptimizer,
  is_of_the_new_kind,
)

__all__ = []


# Registered, so that a Keras model saved compiled with the wrapper loads
# without custom_objects (under the name it always had).
@tf.keras.utils.register_keras_serializable(
    package="estimator_accum", name="AccumulatingKerasOptimizer")
class _LegacyAccumulatingKerasOptimizer(AccumulatingKerasOptimizer,
                                        tf.keras.optimizers.legacy.Optimizer):
  """`AccumulatingKerasOptimizer` around a legacy or tf.compat.v1
  optimizer: a Keras legacy optimizer."""

  @classmethod
  def takes(cls, optimizer):
    return not is_of_the_new_kind(optimizer)

  @property
  def iterations(self):
    """int64 variable counting micro-batches (Keras's `iterations`); the
    estimators that take Keras optimizers set it to their global step.
    Made here, it is named and checkpointed `micro_batches`: the key
    `iter` is the inner optimizer's, which counts updates as the plain
    optimizer's `iter` does."""
    if self._iterations is None:
      # Outside any tf.function being traced, as Keras makes its own.
      with tf.init_scope(), self._distribution_strategy_scope():
        self._iterations = self.add_weight(
            "micro_batches", shape=[], dtype=tf.int64, trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self._weights.append(self._iterations)
    return self._iterations

  @iterations.setter
  def iterations(self, variable):
    tf.keras.optimizers.legacy.Optimizer.iterations.fset(self, variable)

  @property
  def weights(self):
    """The optimizer's state, as Keras's `get_weights`, `set_weights` and
    `.h5` files of a compiled model hold it: the micro-batch count, the
    inner optimizer's weights (its update count and slots), then the
    window's state variables in this graph."""
    inner = self._window.optimizer
    inner = (inner.weights if isinstance(inner, tf.keras.optimizers.legacy.Optimizer)
             else inner.variables())
    return (list(self._weights) + list(inner) +
            self._window.checkpoints.variables())

  def variables(self):
    """As `weights`."""
    return self.weights

  def _state_by_key(self):
    """{position: a copy of the weight} (`weights`' order): TensorFlow
    saves a slot variable only as its variable's slot, never as another
    object's dependency. The copies live in host memory, made at the first
    SavedModel save and set anew at each."""
    weights = self.weights
    copies = self._window.keras.saved_model_copies
    if [tuple(c.shape) for c in copies] != [tuple(w.shape) for w in weights]:
      with tf.init_scope(), tf.device("/cpu:0"):
        copies = [tf.Variable(replicas.saved_value(w), trainable=False,
                              name=f"saved_weight_{i}")
                  for i, w in enumerate(weights)]
      self._window.keras.saved_model_copies = copies
    else:
      with tf.init_scope():
        for copy_, weight in zip(copies, weights):
          copy_.assign(replicas.saved_value(weight))
    return {str(i): copy_ for i, copy_ in enumerate(copies)}

  def _take_saved_model_state(self, state):
    self.set_weights([state[str(i)] for i in range(len(state))])

  def set_weights(self, weights):
    """Sets the optimizer's state from `get_weights`' list. Before the window
    is built (Keras's `load_model` of an `.h5` file sets it right after
    compile), the values beyond the micro-batch count are kept and set when
    it is built, and must then match its weights in number and shapes."""
    weights = list(weights)
    self._window.keras.revived_without_window = False  # (an .h5 file's state)
    _ = self.iterations  # (the first value, made if need be)
    if weights and len(weights) != len(self.weights):
      # Read now: Keras hands over datasets of an .h5 file it then closes.
      self._window.keras.pending_weights = [
          np.asarray(w) for w in weights[len(self._weights):]]
      weights = weights[:len(self._weights)]
    tf.keras.optimizers.legacy.Optimizer.set_weights(self, weights)

  def window_built(self):
    """Sets the values `set_weights` kept, now that the window is built."""
    pending = self._window.keras.pending_weights
    if pending is None:
      return
    weights = self.weights[len(self._weights):]
    shapes = [tuple(w.shape) for w in weights]
    given = [p.shape for p in pending]
    if shapes != given:
      raise ValueError(
          f"set_weights was given {len(pending) + len(self._weights)} "
          f"values of shapes {given} after the micro-batch count, but this "
          f"optimizer's weights there, now that its window is built, are "
          f"{len(weights)} of shapes {shapes}: they were saved by another "
          "optimizer or window.")

    def set_all():
      # Now (TensorFlow 2 builds the window in the train step's
      # tf.function: an assignment made there would run at every step).
      self._window.keras.pending_weights = None
      with tf.init_scope():
        if not tf.executing_eagerly():  # a tf.compat.v1 graph: run now
          tf.keras.backend.batch_set_value(list(zip(weights, pending)))
          return
        for weight, value in zip(weights, pending):
          replicas.assign_saved(weight, value)

    if replicas.in_a_replica_of_a_strategy() and not (
        tf.compat.v1.executing_eagerly_outside_functions()):
      raise ValueError(
          "optimizer weights set before the window was built (load_model of "
          "an .h5 file) cannot be set in a replica's context under a "
          "distribution strategy in a tf.compat.v1 graph: call set_weights "
          "after the first fit, or save and load with "
          "save_weights/load_weights.")
    # Once, in cross-replica context (each replica builds the window).
    replicas.once_across_replicas(set_all)

  @as_written
  def get_updates(self, loss, params):
    """[the train op of one micro-batch of `loss`], as Keras returns."""
    return [self._from_loss(loss, params, None)]

  @as_written
  def get_gradients(self, loss, params):
    """The gradients of one micro-batch's loss, as they are."""
    self._check_not_loss_scaled_outside()
    return [gradient for gradient, _ in gradients_as_they_are(
        loss, params, dict(colocate_gradients_with_ops=False))]
