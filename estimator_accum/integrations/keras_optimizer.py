"""`AccumulatingKerasOptimizer`: accumulation for code that calls a Keras
optimizer itself.

In TensorFlow 2, Keras's `model.fit` and a custom `train_step` call it
inside a tf.function, where it builds the window of
`build_accumulating_train_op` (its state made once,
`checkpoints/function_variables.py`). TensorFlow 2's canned estimators
(`tf.estimator.DNNRegressor`) call a Keras optimizer's `get_updates`; Keras
models compiled with one (through `model_to_estimator`, or `model.fit` in
graph mode) call `apply_gradients` in a tf.compat.v1 graph. Handing any of
them `AccumulatingKerasOptimizer` instead of the optimizer gives the window,
with nothing else changed.

`AccumulatingKerasOptimizer(optimizer, k)` is a Keras optimizer of the
optimizer's own kind, as Keras's LossScaleOptimizer is: around a
`tf.keras.optimizers.Optimizer` (TensorFlow 2) one of that kind
(`keras_optimizer_v3.py`), so that Keras treats it as it treats that
optimizer (an EMA's weights written into the model at the end of `fit`,
`.keras` files); around a legacy or tf.compat.v1 optimizer a legacy one.
"""

import copy
import inspect
import sys

import numpy as np
import tensorflow as tf

from estimator_accum import _checks, tf_private
from estimator_accum._autograph import as_written
from estimator_accum.checkpoints import saved_model_state
from estimator_accum.distribution import replicas
from estimator_accum.integrations.keras_loss_scale import KerasLossScaling
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
from estimator_accum.window import reductions
from estimator_accum.window.compact import SPARSE_THRESHOLD_BYTES

__all__ = ["AccumulatingKerasOptimizer"]

# Its defaults of the window options, where they are not the table's: the
# loss scaled as Keras scales it (dynamically, for a mixed_float16 model).
_DEFAULTS = dict(WRAPPER_DEFAULTS, reduction="mean", loss_scale="auto")

def _is_keras3_optimizer(optimizer):
  """Whether `optimizer` is a Keras 3 optimizer (Keras 3 then imported
  already: it made the optimizer)."""
  keras = sys.modules.get("keras")
  version = str(getattr(keras, "__version__", "2"))
  return (int(version.split(".")[0]) >= 3 and
          isinstance(optimizer, keras.optimizers.Optimizer))


def is_of_the_new_kind(optimizer):
  """Whether `optimizer` (or the one a Keras LossScaleOptimizer wraps) is a
  `tf.keras.optimizers.Optimizer`, in TensorFlow 2 mode."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  return (isinstance(inner, tf.keras.optimizers.Optimizer) and
          tf.compat.v1.executing_eagerly_outside_functions())


class _KerasConfig:
  """How the wrapper is saved: its Keras config, and its state in a
  SavedModel (both kinds; each says `_state_by_key` and
  `_take_saved_model_state`)."""

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    # A SavedModel's loader revives an optimizer as Keras's
    # RestoredOptimizer: the new kind's cannot take slot variables back
    # ("no attribute 'add_slot'"), the legacy kind's makes each slot the
    # shape of its variable. While one is saved, the window is not served
    # as slots; its whole state is one child (saved_model_state.py).
    self._window.saving_savedmodel = save_type == "savedmodel"
    children = super()._trackable_children(save_type, **kwargs)
    # (TensorFlow 2 only: a tf.compat.v1 graph's SavedModel holds no window,
    # and its optimizer refuses to train on.)
    if (save_type == "savedmodel" and
        tf.compat.v1.executing_eagerly_outside_functions()):
      children = dict(children)
      children[saved_model_state.CHILD] = saved_model_state.holder(
          self._state_by_key())
    return children

  def _take_state_of_the_savedmodel_being_loaded(self):
    """Made by Keras's load_model: takes the state back from the SavedModel
    it loads, if this version wrote it."""
    path = tf_private.keras_saved_model_being_loaded()
    state = saved_model_state.read(path) if path else None
    if state is not None:
      self._window.revived_without_window = False
      self._take_saved_model_state(state)

  def get_config(self):
    """The wrapper's arguments, the inner optimizer serialized as Keras
    serializes optimizers: `from_config` makes a new wrapper around a new
    inner optimizer. `tf.keras.estimator.model_to_estimator` clones a
    compiled model's optimizer this way into every graph it builds.

    A `tf.compat.v1.train` inner optimizer, `communication_options` and
    `after_update` are held as the objects themselves (they have no Keras
    config): such a config is for `from_config`, not for JSON.
    """
    config = self._window.arguments()
    inner = config.pop("optimizer")
    if isinstance(inner, (tf.keras.optimizers.legacy.Optimizer,
                          tf.keras.optimizers.Optimizer)):
      inner = tf.keras.optimizers.serialize(inner)
    return {"optimizer": inner, **config}

  @classmethod
  def from_config(cls, config, custom_objects=None):
    """A new wrapper from `get_config`'s dict (the inner optimizer new too,
    when it was serialized)."""
    config = dict(config)
    inner = config.pop("optimizer")
    if isinstance(inner, dict):
      # Keras's deserialize rewrites the dict it is given.
      inner = tf.keras.optimizers.deserialize(
          copy.deepcopy(inner), custom_objects=custom_objects,
          use_legacy_optimizer=cls._LEGACY_KIND)
    return cls(inner, **config)

class AccumulatingKerasOptimizer(_KerasConfig, Wrapper, KerasLossScaling):
  """Accumulation for code that takes a Keras optimizer: Keras's
  `model.fit` and a custom `train_step` in TensorFlow 2, TensorFlow 2's
  canned estimators (`tf.estimator.DNNRegressor`, `LinearClassifier`,
  `DNNLinearCombinedClassifier`, ...), which call `get_updates`, and graph
  code calling `minimize` or `apply_gradients`.

  ```python
  model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(1e-3), k=4), loss=...)
  model.fit(dataset.batch(8))                     # batch 32, exactly
  ```

  A canned estimator takes it through a callable, as any Keras optimizer
  (docs/user_guide.md, "TensorFlow 2's canned estimators"). Around a Keras 3 optimizer (TensorFlow 2.16+'s Keras)
  it is `integrations/keras3.py`'s, on one device. Else it is a Keras
  optimizer of its optimizer's kind (a
  `tf.keras.optimizers.Optimizer` around one, in TensorFlow 2; a legacy
  one otherwise), and a Keras LossScaleOptimizer: `compile` does not wrap
  it in another for a mixed_float16 model; it scales the loss itself, once
  per window (`loss_scale="auto"`). docs/keras.md has the TensorFlow 2
  details.

  The micro-batch counter is the optimizer's `iterations`, which those
  estimators set to their global step: it counts micro-batches. The inner
  optimizer's own `iterations` counts updates, so a Keras
  `LearningRateSchedule` runs as in big-batch training. As Keras
  optimizers do, it takes the loss (or gradients) of each replica as
  scaled by the caller for a sum over the replicas (the canned heads divide
  a mean loss by the number of replicas).

  The loss of a micro-batch is taken to be a mean over its examples
  (`reduction="mean"`, the canned heads' default `SUM_OVER_BATCH_SIZE`);
  with a canned head's `loss_reduction=SUM` pass `reduction="sum"`: Keras
  losses do not record their reduction where it could be read.

  Args:
    optimizer: a `tf.keras.optimizers.Optimizer` (TensorFlow 2), a
      `tf.keras.optimizers.legacy.Optimizer` or a `tf.compat.v1.train`
      one, or a Keras LossScaleOptimizer around one (its settings taken),
      applied once per window.
    k: int >= 1, micro-batches per update.
    clip_norm, reduction, accumulator_dtype, accumulator_placement,
      summaries, loss_scale, sparse_accumulation, sparse_threshold_bytes,
      communication_options, table_all_reduce, communication_dtype,
      overlap_backward, sequential_apply, fused_apply, after_update,
      log_every_n_micro_batches, max_consecutive_skipped_windows, name: the
      window options, keyword-only, each documented with its check in
      `estimator_accum.options.OPTIONS` and in docs/user_guide.md
      ("Options").

  Here `reduction` is "mean" unless given (not None: Keras losses do not
  record theirs), `loss_scale` is "auto", and `name` defaults to None, as
  for `AccumulatingOptimizer`.
  """

  accumulates_micro_batches = True
  # The defaults of the window options where they are not the table's.
  _OPTION_DEFAULTS = _DEFAULTS

  # Arguments of the Keras optimizer base class, besides the name.
  _KERAS_ARGUMENTS = {}
  # Whether the inner optimizer is of Keras's legacy kind.
  _LEGACY_KIND = True

  def __new__(cls, optimizer=None, *args, **kwargs):
    """An instance of the kind for `optimizer`: of the subclass (each
    kind's module defines one, and `estimator_accum` imports them all)
    whose `takes(optimizer)`, when called as AccumulatingKerasOptimizer."""
    if _is_keras3_optimizer(optimizer):
      from estimator_accum.integrations import keras3  # noqa: PLC0415

      return keras3.AccumulatingKeras3Optimizer(optimizer, *args, **kwargs)
    del args, kwargs
    _checks.check_keras_2(
        "AccumulatingKerasOptimizer", "optimizer", optimizer,
        under_keras_3="give it a Keras 3 optimizer (keras.optimizers.Adam), "
        "which it runs on one device under Keras 3 (docs/releases.md)")
    if cls is AccumulatingKerasOptimizer:
      cls = next(kind for kind in cls.__subclasses__()
                 if kind.takes(optimizer))
    return super().__new__(cls)

  @classmethod
  def takes(cls, optimizer):
    """Whether this kind wraps `optimizer` (each kind says)."""
    raise NotImplementedError

  def __init__(
      self, optimizer, k, *,
      # The window options, in the order of the table (options.OPTIONS),
      # with the defaults of this wrapper (_DEFAULTS):
      clip_norm=None, reduction="mean", accumulator_dtype=tf.float32,
      accumulator_placement="device", summaries=True, loss_scale="auto",
      sparse_accumulation="auto",
      sparse_threshold_bytes=SPARSE_THRESHOLD_BYTES,
      communication_options=None, table_all_reduce="auto",
      communication_dtype=None, overlap_backward=True, sequential_apply=True,
      fused_apply=False,
      after_update=None, log_every_n_micro_batches=100,
      max_consecutive_skipped_windows=DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS,
      name=None):
    options = window_options(locals())
    _checks.check_reduction(reduction)
    # Set first: Keras's constructor looks up checkpoint dependencies.
    self._window = WrapperWindow(optimizer, k, options)
    # Made by Keras's load_model: the window comes back from a SavedModel
    # this version wrote (read here) or an .h5 file (through set_weights,
    # which clears this); one of an older version holds none.
    self._window.revived_without_window = tf_private.in_keras_load()
    super().__init__(name=options.get("name") or DEFAULT_NAME,
                     **self._KERAS_ARGUMENTS)
    if self._window.revived_without_window:
      self._take_state_of_the_savedmodel_being_loaded()

  # What the class is called with: `__init__`'s arguments. (The metaclass
  # Keras's LossScaleOptimizer needs takes (*args, **kwargs), which
  # `inspect.signature` would otherwise show.)
  __signature__ = inspect.signature(__init__).replace(parameters=list(
      inspect.signature(__init__).parameters.values())[1:])

  @property
  def learning_rate(self):
    """The inner optimizer's learning rate (what Keras callbacks read and
    set: it moves once per window)."""
    return self._window.inner_optimizer().learning_rate

  @learning_rate.setter
  def learning_rate(self, value):
    self._window.inner_optimizer().learning_rate = value

  lr = learning_rate

  @as_written
  def minimize(self, loss, var_list, grad_loss=None, name=None, tape=None):
    """The train op of one micro-batch of `loss`, in a graph or a
    tf.function."""
    del name, tape  # (the window differentiates the loss itself)
    if callable(loss):
      loss = loss()
    if callable(var_list):
      var_list = var_list()
    return self._from_loss(loss, var_list, grad_loss)

  @as_written
  def apply_gradients(self, grads_and_vars, name=None,
                      experimental_aggregate_gradients=True,
                      skip_gradients_aggregation=False):
    """The train op that adds one micro-batch's gradients to the window
    (the window all-reduces them, once per window: the aggregation
    arguments of Keras's two kinds of optimizers are taken and not used).
    In a tf.function, gradients of a loss scaled with `get_scaled_loss`
    must be unscaled with `get_unscaled_gradients` first."""
    del name, experimental_aggregate_gradients, skip_gradients_aggregation
    self._check_not_loss_scaled_outside()
    return self._window.train_op(
        self, self.iterations, grads_and_vars=grads_and_vars,
        scaled_by_caller=True, times=self._replicas_summed())

  def _check_not_loss_scaled_outside(self):
    """Refuses a Keras LossScaleOptimizer around the wrapper: it would
    all-reduce, check and skip every micro-batch, and call the wrapper
    inside its own tf.cond."""
    if tf_private.is_wrapped_by_keras_loss_scale_optimizer(self):
      raise ValueError(
          "a Keras LossScaleOptimizer wraps this AccumulatingKerasOptimizer, "
          "which scales the loss itself, once per window (it is a "
          "LossScaleOptimizer: compile leaves it as it is): pass it to "
          "compile unwrapped, with loss_scale='dynamic' or a number, or give "
          "it the LossScaleOptimizer as its optimizer, whose settings it "
          "takes.")

  def _from_loss(self, loss, var_list, grad_loss):
    self._check_not_loss_scaled_outside()
    _checks.check_not_eager()
    return self._window.train_op(
        self, self.iterations, loss=loss, var_list=var_list,
        gradient_options=gradient_options(
            tf.compat.v1.train.Optimizer.GATE_OP, None, False, grad_loss),
        times=self._replicas_summed())

  def _replicas_summed(self):
    """By how much the window's mean over replicas must be multiplied to be
    the sum over replicas Keras optimizers form: a mean window's is the
    replicas' number; a summed window already sums them."""
    if reductions.for_options(self._window.reduction(),
                              None).divides_by_replicas:
      return replicas.num_replicas()
    return 1


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
    copies = self._window.saved_model_copies
    if [tuple(c.shape) for c in copies] != [tuple(w.shape) for w in weights]:
      with tf.init_scope(), tf.device("/cpu:0"):
        copies = [tf.Variable(replicas.saved_value(w), trainable=False,
                              name=f"saved_weight_{i}")
                  for i, w in enumerate(weights)]
      self._window.saved_model_copies = copies
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
    self._window.revived_without_window = False  # (an .h5 file's state)
    _ = self.iterations  # (the first value, made if need be)
    if weights and len(weights) != len(self.weights):
      # Read now: Keras hands over datasets of an .h5 file it then closes.
      self._window.pending_weights = [
          np.asarray(w) for w in weights[len(self._weights):]]
      weights = weights[:len(self._weights)]
    tf.keras.optimizers.legacy.Optimizer.set_weights(self, weights)

  def window_built(self):
    """Sets the values `set_weights` kept, now that the window is built."""
    pending = self._window.pending_weights
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
      self._window.pending_weights = None
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
