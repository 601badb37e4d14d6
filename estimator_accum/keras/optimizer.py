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
(`optimizer_v3.py`), so that Keras treats it as it treats that
optimizer (an EMA's weights written into the model at the end of `fit`,
`.keras` files); around a legacy or tf.compat.v1 optimizer a legacy one.
"""

import copy
import inspect
import sys

import tensorflow as tf

from estimator_accum import _checks, keras_private
from estimator_accum._autograph import as_written
from estimator_accum.checkpoints import saved_model_state
from estimator_accum.distribution import replicas
from estimator_accum.integrations.wrappers import (
  DEFAULT_NAME,
  WRAPPER_DEFAULTS,
  Wrapper,
  WrapperWindow,
  gradient_options,
)
from estimator_accum.keras.loss_scale import KerasLossScaling
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
    self._window.keras.saving_savedmodel = save_type == "savedmodel"
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
    path = keras_private.keras_saved_model_being_loaded()
    state = saved_model_state.read(path) if path else None
    if state is not None:
      self._window.keras.revived_without_window = False
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

  Around a Keras 3 optimizer (TensorFlow 2.16+'s Keras) it is
  `keras/optimizer_keras3.py`'s. Else it is a Keras optimizer of its
  optimizer's kind (a `tf.keras.optimizers.Optimizer` around one, a legacy
  one otherwise) and a Keras LossScaleOptimizer: `compile` does not wrap it
  in another for a mixed_float16 model; it scales the loss itself, once per
  window (`loss_scale="auto"`). Its `iterations` counts micro-batches (the
  canned estimators set it to their global step), the inner optimizer's
  counts updates (a `LearningRateSchedule` runs as in big-batch training).
  As Keras optimizers do, it takes each replica's loss (or gradients) as
  scaled for a sum over the replicas. A loss is taken as a mean over its
  examples (`reduction="mean"`); with a canned head's `loss_reduction=SUM`
  pass `reduction="sum"` (Keras losses do not record theirs). docs/keras.md
  and docs/user_guide.md ("TensorFlow 2's canned estimators") say more.

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
      window options (keyword-only), each documented in
      `estimator_accum.options.OPTIONS` and docs/user_guide.md; here
      `reduction` is "mean" unless given, `loss_scale` "auto", `name` None.
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
      from estimator_accum.keras import (
        optimizer_keras3 as keras3,  # noqa: PLC0415
      )

      return keras3.AccumulatingKeras3Optimizer(optimizer, *args, **kwargs)
    del args, kwargs
    _checks.check_keras_2(
        "AccumulatingKerasOptimizer", "optimizer", optimizer,
        under_keras_3="give it a Keras 3 optimizer (keras.optimizers.Adam), "
        "which it wraps under Keras 3 (docs/releases.md)")
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
    self._window.keras.revived_without_window = keras_private.in_keras_load()
    super().__init__(name=options.get("name") or DEFAULT_NAME,
                     **self._KERAS_ARGUMENTS)
    if self._window.keras.revived_without_window:
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
    if keras_private.is_wrapped_by_keras_loss_scale_optimizer(self):
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
