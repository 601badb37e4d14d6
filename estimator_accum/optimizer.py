"""Optimizer wrappers: accumulation for code that calls an optimizer.

Canned estimators (`tf.compat.v1.estimator.DNNRegressor(optimizer=...)`),
`tf_slim.learning.create_train_op` and other code written against
`tf.compat.v1.train.Optimizer` call `minimize`, or `compute_gradients` then
`apply_gradients`, themselves; TensorFlow 2's canned estimators
(`tf.estimator.DNNRegressor`) call a Keras optimizer's `get_updates`.
Handing them `AccumulatingOptimizer` or `AccumulatingKerasOptimizer` instead
of the optimizer gives the window of `build_accumulating_train_op`, with
nothing else changed.
"""

import copy

import numpy as np
import tensorflow as tf

from estimator_accum import _checks, object_checkpoints, progress
from estimator_accum import loss_scale as _loss_scale
from estimator_accum._autograph import as_written
from estimator_accum.accumulators import (
  graph_registry,
  recording_state_variables,
  replica_id,
  state_variable,
)
from estimator_accum.gradient_ops import scale_gradient
from estimator_accum.sparse import SPARSE_THRESHOLD_BYTES
from estimator_accum.train_op import accumulating_train_op, claimed_names
from estimator_accum.window import BYTES_PER_PACK

__all__ = ["AccumulatingKerasOptimizer", "AccumulatingOptimizer"]

_DEFAULT_NAME = "gradient_accumulation"
# Graph attribute: {replica id: the default names its windows were given}.
_DEFAULT_NAMES_ATTRIBUTE = "_estimator_accum_default_names"
_GATES = (tf.compat.v1.train.Optimizer.GATE_NONE,
          tf.compat.v1.train.Optimizer.GATE_OP,
          tf.compat.v1.train.Optimizer.GATE_GRAPH)


class _Wrapper:
  """What both wrappers expose of their window."""

  @property
  def k(self):
    """Micro-batches per update."""
    return self._window.k

  @property
  def optimizer(self):
    """The optimizer applied once per window."""
    return self._window.optimizer

  # The inner optimizer's slots are the wrapper's, for its callers and for
  # object-based checkpoints, which find slots through these two and so
  # name them as the plain optimizer's (the wrapper takes its place). The
  # window's state of each trained variable is served as its slots too
  # (`window_accum`, ...), so that checkpoints key it by the variable's
  # path in the model, not by its name.
  def get_slot(self, var, name):
    """The inner optimizer's slot `name` of `var`, or the window's state of
    `var` for a slot named `window_...` (under a distribution strategy, a
    view of the per-replica state for checkpoints)."""
    if name.startswith(object_checkpoints.WINDOW_SLOT_PREFIX):
      return object_checkpoints.window_slot(self, var, name)
    return self._window.optimizer.get_slot(var, name)

  def get_slot_names(self):
    """The inner optimizer's slot names and the window's, in this graph."""
    return (list(self._window.optimizer.get_slot_names()) +
            object_checkpoints.window_slot_names(self))

  def _create_or_restore_slot_variable(self, slot_variable_position,
                                       slot_name, variable):
    # A checkpoint restored before the window is built (Keras's
    # load_weights before fit) hands the slots it holds under the wrapper
    # to the optimizer that will make them, and the window's to the window.
    if slot_name.startswith(object_checkpoints.WINDOW_SLOT_PREFIX):
      return object_checkpoints.restore_window_slot(
          self, slot_variable_position, slot_name, variable)
    return self._window.optimizer._create_or_restore_slot_variable(
        slot_variable_position, slot_name, variable)

  def _lookup_dependency(self, name, cached_dependencies=None):
    # Window state a checkpoint holds that this window does not have is
    # refused, not dropped (and state keyed as before is found).
    found = super()._lookup_dependency(name, cached_dependencies)
    if found is None:
      found = object_checkpoints.lookup_window_state(self, name)
    return found


class AccumulatingOptimizer(_Wrapper, tf.compat.v1.train.Optimizer):
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
    clip_norm, accumulator_dtype, summaries, loss_scale,
      sparse_accumulation, sparse_threshold_bytes, communication_options,
      after_update: as for `build_accumulating_train_op` (`loss_scale`
      needs `minimize`: it scales the loss).
    reduction: None (the loss's own reduction, above), "mean", "sum" or
      "running_mean".
    name: str, the name scope of the window's ops and the prefix of its
      counters; also this optimizer's name. Default: "gradient_accumulation",
      or "gradient_accumulation_1", ... in a graph where another train op
      took it (a wide-and-deep estimator's two optimizers).

  Raises:
    TypeError, ValueError: a bad argument, named, as
      `build_accumulating_train_op` raises them.
  """

  # What tells build_accumulating_train_op not to accumulate twice.
  accumulates_micro_batches = True

  def __init__(self, optimizer, k, *, clip_norm=None, reduction=None,
               accumulator_dtype=tf.float32, summaries=True, loss_scale=None,
               sparse_accumulation="auto",
               sparse_threshold_bytes=SPARSE_THRESHOLD_BYTES,
               communication_options=None, after_update=None, name=None):
    self._window = _WrapperWindow(
        optimizer, k, clip_norm=clip_norm, reduction=reduction,
        accumulator_dtype=accumulator_dtype, summaries=summaries,
        loss_scale=loss_scale, sparse_accumulation=sparse_accumulation,
        sparse_threshold_bytes=sparse_threshold_bytes,
        communication_options=communication_options,
        after_update=after_update, name=name)
    super().__init__(use_locking=False, name=name or _DEFAULT_NAME)

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
        self, loss, None, global_step, var_list, _gradient_options(
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
    return _gradients(loss, var_list, _gradient_options(
        gate_gradients, aggregation_method, colocate_gradients_with_ops,
        grad_loss))

  @as_written
  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Returns the train op that adds one micro-batch's `grads_and_vars` (from
    `compute_gradients`) to the window, and applies the window at its k-th
    micro-batch. `global_step` as for `minimize`; `name` is not used."""
    del name  # The window's scope is this optimizer's name.
    return self._window.train_op(self, None, grads_and_vars, global_step)

  def variables(self):
    """The inner optimizer's variables, then the window's state variables
    in this graph (its accumulators and counters)."""
    return (list(self._window.optimizer.variables()) +
            object_checkpoints.window_variables(self))


# Registered, so that a Keras model saved compiled with the wrapper loads
# without custom_objects.
@tf.keras.utils.register_keras_serializable(package="estimator_accum")
class AccumulatingKerasOptimizer(_Wrapper,
                                 tf.keras.optimizers.legacy.Optimizer):
  """`AccumulatingOptimizer` for code that takes a Keras legacy optimizer:
  TensorFlow 2's canned estimators (`tf.estimator.DNNRegressor`,
  `LinearClassifier`, `DNNLinearCombinedClassifier`, ...), which call
  `get_updates`, and graph code calling `minimize` or `apply_gradients`.

  ```python
  estimator = tf.estimator.DNNRegressor(
      hidden_units=[64], feature_columns=columns,
      optimizer=lambda: estimator_accum.AccumulatingKerasOptimizer(
          tf.keras.optimizers.legacy.Adam(1e-3), k=4, clip_norm=1.0))
  ```

  (A callable, as for any Keras optimizer given to an Estimator that
  trains more than once: an instance can only be used in one graph.)

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
    optimizer: a `tf.keras.optimizers.legacy.Optimizer` (or a
      `tf.compat.v1.train` one), applied once per window.
    k: int >= 1, micro-batches per update.
    reduction: "mean" (default), "sum" or "running_mean".
    name: as for `AccumulatingOptimizer`.
    **settings: clip_norm, accumulator_dtype, summaries, loss_scale,
      sparse_accumulation, sparse_threshold_bytes, communication_options,
      after_update, as for `AccumulatingOptimizer`.
  """

  accumulates_micro_batches = True

  def __init__(self, optimizer, k, *, reduction="mean", name=None,
               **settings):
    _checks.check_reduction(reduction)
    window = _WrapperWindow(optimizer, k, reduction=reduction, name=name,
                            **settings)
    super().__init__(name=name or _DEFAULT_NAME)
    self._window = window

  @property
  def iterations(self):
    """int64 variable counting micro-batches (Keras's `iterations`); the
    estimators that take Keras optimizers set it to their global step.
    Made here, it is named and checkpointed `micro_batches`: the key
    `iter` is the inner optimizer's, which counts updates as the plain
    optimizer's `iter` does."""
    if self._iterations is None:
      with self._distribution_strategy_scope():
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
            object_checkpoints.window_variables(self))

  def variables(self):
    """As `weights`."""
    return self.weights

  def set_weights(self, weights):
    """Sets the optimizer's state from `get_weights`' list. Before the window
    is built (Keras's `load_model` of an `.h5` file sets it right after
    compile), the values beyond the micro-batch count are kept and set when
    it is built, and must then match its weights in number and shapes."""
    weights = list(weights)
    _ = self.iterations  # (the first value, made if need be)
    if weights and len(weights) != len(self.weights):
      # Read now: Keras hands over datasets of an .h5 file it then closes.
      self.__dict__["_pending_weights"] = [
          np.asarray(w) for w in weights[len(self._weights):]]
      weights = weights[:len(self._weights)]
    tf.keras.optimizers.legacy.Optimizer.set_weights(self, weights)

  def _set_pending_weights(self):
    """Sets the values `set_weights` kept, now that the window is built."""
    pending = self.__dict__.pop("_pending_weights", None)
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
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False:
      raise ValueError(
          "optimizer weights set before the window was built (load_model of "
          "an .h5 file) cannot be set in a replica's context under a "
          "distribution strategy: call set_weights after the first fit, or "
          "save and load with save_weights/load_weights.")
    tf.keras.backend.batch_set_value(list(zip(weights, pending)))

  @as_written
  def get_updates(self, loss, params):
    """[the train op of one micro-batch of `loss`], as Keras returns."""
    return [self._from_loss(loss, params, None)]

  @as_written
  def minimize(self, loss, var_list, grad_loss=None, name=None, tape=None):
    """The train op of one micro-batch of `loss` (graph mode; `name` and
    `tape` are not used)."""
    del name, tape
    if callable(loss):
      loss = loss()
    if callable(var_list):
      var_list = var_list()
    return self._from_loss(loss, var_list, grad_loss)

  @as_written
  def get_gradients(self, loss, params):
    """The gradients of one micro-batch's loss, as they are."""
    self._check_not_loss_scaled_outside()
    return [gradient for gradient, _ in _gradients(
        loss, params, dict(colocate_gradients_with_ops=False))]

  @as_written
  def apply_gradients(self, grads_and_vars, name=None,
                      experimental_aggregate_gradients=True):
    """The train op that adds one micro-batch's gradients to the window."""
    del name, experimental_aggregate_gradients
    self._check_not_loss_scaled_outside()
    grads_and_vars = _checks.check_grads_and_vars(grads_and_vars)
    replicas = self._replicas_summed()
    if replicas > 1:
      grads_and_vars = [
          (None if g is None else scale_gradient(g, tf.cast(replicas, g.dtype)),
           v) for g, v in grads_and_vars]
    train_op = self._window.train_op(self, None, grads_and_vars,
                                     self.iterations)
    self._set_pending_weights()
    return train_op

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
    if isinstance(inner, tf.keras.optimizers.legacy.Optimizer):
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
      inner = tf.keras.optimizers.deserialize(copy.deepcopy(inner),
                                              custom_objects=custom_objects,
                                              use_legacy_optimizer=True)
    return cls(inner, **config)

  def _check_not_loss_scaled_outside(self):
    """Refuses a Keras LossScaleOptimizer around the wrapper: it would call
    `apply_gradients` inside its own tf.cond, where no window can be built
    (Keras's compile puts one around the optimizer of a model whose dtype
    policy is mixed_float16)."""
    if getattr(self, "_is_wrapped_by_loss_scale_optimizer", False):
      raise ValueError(
          "a Keras LossScaleOptimizer wraps this AccumulatingKerasOptimizer "
          "(compile wraps the optimizer of a model whose dtype policy is "
          "mixed_float16) and would call it inside its tf.cond, where the "
          "window cannot be built. Let the wrapper scale the loss: "
          "AccumulatingKerasOptimizer(..., loss_scale='dynamic'), and keep "
          "the model's own dtype policy float32 (give the layers "
          "dtype='mixed_float16', or set the global policy back to float32 "
          "before the model object is made).")

  def _from_loss(self, loss, var_list, grad_loss):
    self._check_not_loss_scaled_outside()
    _checks.check_graph_mode()
    _checks.check_loss(loss)
    replicas = self._replicas_summed()
    if replicas > 1:
      loss = loss * tf.cast(replicas, loss.dtype)
    train_op = self._window.train_op(
        self, loss, None, self.iterations, var_list,
        _gradient_options(tf.compat.v1.train.Optimizer.GATE_OP, None, False,
                          grad_loss))
    self._set_pending_weights()
    return train_op

  def _replicas_summed(self):
    """By how much the window's mean over replicas must be multiplied to be
    the sum over replicas Keras optimizers form: a mean window's is the
    replicas' number; a summed window already sums them."""
    if self._window.reduction() == "sum":
      return 1
    return tf.distribute.get_strategy().num_replicas_in_sync


class _WrapperWindow:
  """The settings of a wrapper's window, checked when the wrapper is made,
  and the window built from them in each graph."""

  def __init__(self, optimizer, k, *, reduction, name, clip_norm=None,
               accumulator_dtype=tf.float32, summaries=True, loss_scale=None,
               sparse_accumulation="auto",
               sparse_threshold_bytes=SPARSE_THRESHOLD_BYTES,
               communication_options=None, after_update=None):
    self.k = _checks.check_k(k)
    inner, _ = _loss_scale.unwrap_optimizer(optimizer, loss_scale)
    _checks.check_optimizer(inner)
    clip_norm = _checks.check_clip_norm(clip_norm)
    if reduction is not None:
      _checks.check_reduction(reduction)
    _checks.check_bool("summaries", summaries)
    if name is not None:
      _checks.check_name(name)
    accumulator_dtype = _checks.check_accumulator_dtype(accumulator_dtype)
    _checks.check_communication_options(communication_options, BYTES_PER_PACK)
    if after_update is not None and not callable(after_update):
      raise TypeError(
          f"after_update must be a callable with no arguments or None, got "
          f"{after_update!r} of type {type(after_update).__name__}.")
    self.optimizer = optimizer
    self._reduction = reduction
    self._given_name = name
    self._settings = dict(
        clip_norm=clip_norm, accumulator_dtype=accumulator_dtype,
        summaries=summaries, loss_scale=loss_scale,
        sparse_accumulation=sparse_accumulation,
        sparse_threshold_bytes=sparse_threshold_bytes,
        communication_options=communication_options,
        after_update=after_update)

  def arguments(self):
    """The arguments that make an equal window: the optimizer, k, the
    given reduction and name, and the settings (the dtype by name)."""
    settings = dict(self._settings)
    settings["accumulator_dtype"] = settings["accumulator_dtype"].name
    return dict(optimizer=self.optimizer, k=self.k, reduction=self._reduction,
                name=self._given_name, **settings)

  def reduction(self):
    """The window's reduction: the given one, else the loss's own."""
    return self._reduction or _loss_reduction()

  def train_op(self, owner, loss, grads_and_vars, global_step, var_list=None,
               gradient_options=None, reduction=None):
    """The train op of one micro-batch, from its loss or its gradients.

    `owner`, the wrapper, then tracks the window's state variables and the
    inner optimizer's own (`object_checkpoints.track_window`), so that object-based
    checkpoints of whatever tracks the wrapper (a Keras model compiled with
    it, as `model_to_estimator` and `save_weights` save them) hold the
    window and the optimizer's state, as name-based ones do.
    """
    _checks.check_graph_mode()
    name = self._name()
    with recording_state_variables() as state:
      if global_step is None:
        global_step = state_variable(
            f"{name}/micro_batches", [], tf.int64, per_replica=False)
      train_op = accumulating_train_op(
          loss, grads_and_vars, self.optimizer, self.k,
          global_step=global_step, var_list=var_list, num_examples=None,
          reduction=reduction or self.reduction(), name=name,
          gradient_options=(gradient_options or
                            dict(colocate_gradients_with_ops=False)),
          **self._settings)
    if isinstance(global_step, tf.Variable):
      # The caller's counter (a Keras wrapper's `iterations`, Estimator's
      # global step) is part of the window's position.
      state.setdefault("micro_batches", global_step)
    object_checkpoints.track_window(owner, self.optimizer, state, name)
    return train_op

  def _name(self):
    """The given name, or the next default name of this replica."""
    if self._given_name is not None:
      return self._given_name
    return _next_default_name()


def _next_default_name():
  """"gradient_accumulation" for the first default-named window a replica
  builds in the graph, then "gradient_accumulation_1", ..., skipping the
  names windows built with a name of their own took. Counted per replica:
  under MirroredStrategy each replica builds the same windows, in the same
  order, from optimizers a canned estimator makes anew for each replica."""
  handed = graph_registry(_DEFAULT_NAMES_ATTRIBUTE)
  mine = handed.setdefault(replica_id(), [])
  named = claimed_names(tf.compat.v1.get_default_graph()).difference(
      *handed.values())
  number, name = 0, _DEFAULT_NAME
  while name in named or name in mine:
    number += 1
    name = f"{_DEFAULT_NAME}_{number}"
  mine.append(name)
  return name


def _gradients(loss, var_list, options):
  """[(gradient, variable)] of one micro-batch's loss, as they are."""
  _checks.check_graph_mode()
  _checks.check_loss(loss)
  var_list = _checks.check_var_list(var_list)
  if var_list is None:
    var_list = list({id(v): v for v in (
        tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))}.values())
  if not var_list:
    raise ValueError(f"loss {loss.name} cannot be trained: the graph has no "
                     "trainable variables.")
  return list(zip(tf.compat.v1.gradients(loss, var_list, **options), var_list))


def _gradient_options(gate_gradients, aggregation_method,
                      colocate_gradients_with_ops, grad_loss):
  """tf.gradients arguments for Optimizer.compute_gradients' arguments."""
  if gate_gradients not in _GATES:
    raise ValueError(
        f"gate_gradients must be one of Optimizer.GATE_NONE, GATE_OP or "
        f"GATE_GRAPH, got {gate_gradients!r}.")
  return dict(
      grad_ys=grad_loss, aggregation_method=aggregation_method,
      gate_gradients=gate_gradients != tf.compat.v1.train.Optimizer.GATE_NONE,
      colocate_gradients_with_ops=colocate_gradients_with_ops)


def _loss_reduction():
  """"sum" when the last loss reduced in this graph was summed over its batch
  (by tf.compat.v1.losses or Keras), else "mean"."""
  summed = _checks.summed_loss_reduction()
  if summed is None:
    return "mean"
  progress.log_info(
      "gradient accumulation: the loss is summed over its batch (reduction "
      "%s): the window's gradients are summed too, as one batch's are.",
      summed)
  return "sum"
