"""What the optimizer wrappers share (internal to estimator_accum).

`Wrapper` is the part of `AccumulatingOptimizer` and
`AccumulatingKerasOptimizer` that serves their window's and inner
optimizer's state (slots, checkpoints); `WrapperWindow` holds a wrapper's
settings, checked when the wrapper is made, and builds its window in each
graph through `train_op.accumulating_train_op`.
"""

import contextlib
import dataclasses
import typing

import tensorflow as tf

from estimator_accum import _checks, graph_state, tf_private
from estimator_accum.checkpoints import object_checkpoints
from estimator_accum.checkpoints.function_variables import FunctionVariables
from estimator_accum.checkpoints.state_variables import (
  StateVariables,
  state_variable,
)
from estimator_accum.distribution.replicas import replica_id
from estimator_accum.options import (
  DEFAULT_NAME,
  OPTION_NAMES,
  WindowSettings,
  config_value,
)
from estimator_accum.window import loss_scale as _loss_scale
from estimator_accum.window import micro_batch, progress, reductions
from estimator_accum.window.reports import micro_batch_examples
from estimator_accum.window.train_op import accumulating_train_op, claimed_names

_GATES = (tf.compat.v1.train.Optimizer.GATE_NONE,
          tf.compat.v1.train.Optimizer.GATE_OP,
          tf.compat.v1.train.Optimizer.GATE_GRAPH)


class Wrapper:
  """What both wrappers expose of their window."""

  def before_window(self, var_list):
    """Called before the window is built for `var_list`."""
    del var_list

  def window_built(self):
    """Called once the window is built in a graph or a tf.function."""

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
      return self._window.checkpoints.slot(var, name)
    if not _serves_slots(self._window.optimizer):
      return None
    return self._window.optimizer.get_slot(var, name)

  def get_slot_names(self):
    """The inner optimizer's slot names and the window's, in this graph.
    (A Keras optimizer of the new kind saves its slots itself.)"""
    inner = (list(self._window.optimizer.get_slot_names())
             if _serves_slots(self._window.optimizer) else [])
    if self._window.keras.saving_savedmodel:
      # TensorFlow's loader makes a slot the shape of its variable (a row
      # mask's is not); the SavedModel keeps the window otherwise
      # (checkpoints/saved_model_state.py).
      return inner
    return inner + self._window.checkpoints.slot_names()

  def _create_or_restore_slot_variable(self, slot_variable_position,
                                       slot_name, variable):
    # A checkpoint restored before the window is built (Keras's
    # load_weights before fit) hands the slots it holds under the wrapper
    # to the optimizer that will make them, and the window's to the window.
    if slot_name.startswith(object_checkpoints.WINDOW_SLOT_PREFIX):
      return self._window.checkpoints.restore_slot(
          slot_variable_position, slot_name, variable)
    return tf_private.create_or_restore_slot_variable(
        self._window.optimizer, slot_variable_position, slot_name, variable)

  def _lookup_dependency(self, name, cached_dependencies=None):
    # Window state a checkpoint holds that this window does not have is
    # refused, not dropped (and state keyed as before is found).
    found = super()._lookup_dependency(name, cached_dependencies)
    if found is None:
      found = self._window.checkpoints.lookup(name)
    return found


def _serves_slots(optimizer):
  """Whether `optimizer` serves its slots by name (tf.compat.v1 and Keras
  legacy optimizers), as opposed to tracking them itself."""
  return hasattr(optimizer, "get_slot_names")


# The wrappers' defaults of the window options, where they are not the
# table's: left to each graph.
WRAPPER_DEFAULTS = {"reduction": None, "name": None}


@dataclasses.dataclass
class KerasSaving:
  """What Keras's saving and loading leave with a wrapper's window."""
  # Values Keras's set_weights gave before the window was built.
  pending_weights: typing.Any = None
  # Made by Keras's load_model from a SavedModel, whose window (and
  # micro-batch count) it does not carry: training from here is refused.
  revived_without_window: bool = False
  # Inside a SavedModel save; the state one held, set in the first step;
  # the legacy kind's copies of its weights one saves.
  saving_savedmodel: bool = False
  saved_model_state: typing.Any = None
  saved_model_copies: list = dataclasses.field(default_factory=list)


class WrapperWindow:
  """The settings of a wrapper's window, checked when the wrapper is made,
  and the window built from them in each graph."""

  def __init__(self, optimizer, k, options):
    """`options`: every window option (`options.OPTIONS`), as the wrapper
    was given them or defaults them. `reduction` and `name` may be None,
    left to each graph (the loss's own reduction, the next default name),
    and are checked in their defaults' place."""
    self._given = dict(options)
    self._settings = WindowSettings.checked(
        k, **dict(self._given, reduction=self._given["reduction"] or "mean",
                  name=self._given["name"] or DEFAULT_NAME))
    self.k = self._settings.k
    inner, _ = _loss_scale.unwrap_optimizer(optimizer,
                                            self._settings.loss_scale)
    _checks.check_optimizer(inner)
    self.optimizer = optimizer
    # Unwrapped once: every learning-rate read and write goes to it.
    self._inner = inner
    self.checkpoints = object_checkpoints.WrapperCheckpoints()
    # The state of windows built inside tf.functions (TensorFlow 2).
    self.function_variables = FunctionVariables()
    # [the LossScaleConfig or None] once a window was built: "auto" is read
    # once, and every later build (a tf.function traced again) keeps it.
    self._loss_scale_config = None
    self.keras = KerasSaving()

  def arguments(self):
    """The arguments that make an equal window: the optimizer, k and the
    options as given (the dtype by name; the communication options as
    given, which a config serializes)."""
    return dict(optimizer=self.optimizer, k=self.k, **{
        name: config_value(name, self._given[name]) for name in OPTION_NAMES})

  def reduction(self):
    """The window's reduction: the given one, else the loss's own."""
    return self._given["reduction"] or loss_reduction()

  def inner_optimizer(self):
    """The optimizer applied once per window (a loss-scale optimizer given
    as the optimizer unwrapped)."""
    return self._inner

  def loss_scale_config(self, tensor=None):
    """The window's `LossScaleConfig`, or None: the option, or the
    loss-scale optimizer given; "auto" read from the first loss or
    gradient `tensor` it is asked with (float16 in it: dynamic), and kept
    for every later window (a tf.function traced again). Before that, read
    from Keras's global dtype policy."""
    if self._loss_scale_config is not None:
      return self._loss_scale_config[0]
    _, config = _loss_scale.unwrap_optimizer(
        self.optimizer, self._settings.loss_scale, tensor)
    if tensor is not None:
      self._loss_scale_config = [config]
    return config

  def loss_scaler(self, loss=None):
    """The window's `LossScaler` (its variables made once), for a caller
    that scales `loss` itself in the tf.function the window is built in;
    None when the loss is not scaled.

    Raises:
      RuntimeError: outside a tf.function.
    """
    config = self.loss_scale_config(loss)
    if config is None:
      return None
    if not _in_function():
      raise RuntimeError(
          "get_scaled_loss and get_unscaled_gradients scale with the window's "
          "loss scale inside the tf.function the window is built in (a Keras "
          "train_step); in a tf.compat.v1 graph call minimize(loss), which "
          "scales the loss itself.")
    with self.function_variables.building():
      return _loss_scale.LossScaler(config, self._name(), StateVariables(),
                                    unscales=False)

  def loss_scale_variables(self):
    """[the loss scale, its good windows] made in tf.functions so far, or
    fewer (none before the window is built, or without scaling)."""
    made = self.function_variables.made
    return [made[n] for n in _loss_scale.LossScaler.variable_names(
        self._given["name"] or DEFAULT_NAME) if n in made]

  def train_op(self, owner, global_step, *, loss=None, grads_and_vars=None,
               var_list=None, gradient_options=None, reduction=None,
               scaled_by_caller=False, times=1):
    """The train op of one micro-batch, from its loss or its gradients (as
    the wrapper `owner` was given them: made into one `MicroBatch` here,
    checked once, then multiplied by `times`).

    `owner` then tracks the window's state variables and the inner
    optimizer's own (`WrapperCheckpoints.track`), so that object-based
    checkpoints of whatever tracks the wrapper (a Keras model compiled with
    it, as `model_to_estimator` and `save_weights` save them) hold the
    window and the optimizer's state, as name-based ones do. Its hooks
    `before_window(variables)` and `window_built()` run around the build.
    """
    if self.keras.revived_without_window:
      raise ValueError(
          "this AccumulatingKerasOptimizer was loaded from a SavedModel, "
          "which does not hold its window or micro-batch count: training on "
          "from here would not be the big batch's. Resume from a .keras file "
          "(model.save('model.keras')) or a checkpoint (save_weights, "
          "tf.train.Checkpoint), which keep the window exactly; or compile "
          "the loaded model with a new AccumulatingKerasOptimizer to start "
          "afresh.")
    in_function = _in_function()
    with (self.function_variables.building() if in_function else
          contextlib.nullcontext()):
      _checks.check_graph_mode()
      if grads_and_vars is None:
        batch = micro_batch.of_loss(loss, var_list)
      else:
        batch = micro_batch.of_gradients(
            grads_and_vars, scaled_by_caller=scaled_by_caller and in_function)
      batch = batch.times(times)
      variables = (batch.var_list if batch.loss is not None else
                   [v for _, v in batch.grads_and_vars])
      if variables is not None:
        owner.before_window(list(variables))
      train_op = self._train_op(owner, batch, global_step, gradient_options,
                                reduction)
    owner.window_built()
    return train_op

  def _train_op(self, owner, batch, global_step, gradient_options,
                reduction):
    name = self._name()
    variables = {}
    if global_step is None:
      global_step = state_variable(
          f"{name}/micro_batches", [], tf.int64, per_replica=False)
      variables[f"{name}/micro_batches"] = global_step
    # "auto" loss scaling reads what the micro-batch is computed from, and
    # the examples it weighs are counted from its input.
    self.loss_scale_config(batch.source)
    settings = self._settings.replace(
        reduction=reduction or self.reduction(), name=name,
        loss_scale=self._loss_scale_option(),
        gradient_options=(gradient_options or
                          dict(colocate_gradients_with_ops=False)))
    batch = dataclasses.replace(
        batch, num_examples=_examples(batch.source, settings))
    train_op, window = accumulating_train_op(
        batch, self.optimizer, settings, global_step=global_step)
    window_variables, slots = window.state_variables()
    variables.update(window_variables)
    if isinstance(global_step, tf.Variable):
      # The caller's counter (a Keras wrapper's `iterations`, Estimator's
      # global step) is part of the window's position.
      variables.setdefault("micro_batches", global_step)
    # In a tf.function, tracked (and restored from a checkpoint loaded
    # before) eagerly: not as ops of the function, run at every step.
    with tf.init_scope() if _in_function() else contextlib.nullcontext():
      self.checkpoints.track(owner, self.optimizer, variables, slots, name)
    return train_op

  def _loss_scale_option(self):
    """The `loss_scale` option of the window built now: "auto" as it was
    read when the first window was built (a loss-scale optimizer given
    says how itself)."""
    given = self._settings.loss_scale
    if (not (isinstance(given, str) and given == "auto") or
        _loss_scale.is_loss_scale_optimizer(self.optimizer)):
      return given
    config = self._loss_scale_config[0]
    if config is None:
      return None
    return "dynamic" if config.dynamic else config.initial

  def _name(self):
    return _window_name(self._given["name"])


def _window_name(given):
  """The `given` name, or the next default name of this replica (in a
  tf.function, the default name: the wrapper's state is its own)."""
  if given is not None:
    return given
  if _in_function():
    return DEFAULT_NAME
  return next_default_name()


def _examples(source, settings):
  """In a tf.function, where the window weighs each micro-batch by its
  examples when they can be told (Keras's last batch of an epoch is
  short): the examples on this replica of the micro-batch `source` (its
  loss or a gradient) is computed from; else None."""
  if not (_in_function() and source is not None and
          reductions.for_options(settings.reduction, None).weighs_examples):
    return None
  return micro_batch_examples(source, None)


def _in_function():
  """Whether the window is being built inside a tf.function (TensorFlow 2),
  whose variables must be made once."""
  return tf.compat.v1.get_default_graph().building_function


def next_default_name():
  """"gradient_accumulation" for the first default-named window a replica
  builds in the graph, then "gradient_accumulation_1", ..., skipping the
  names windows built with a name of their own took. Counted per replica:
  under MirroredStrategy each replica builds the same windows, in the same
  order, from optimizers a canned estimator makes anew for each replica."""
  handed = graph_state.owned("default_names", dict)
  mine = handed.setdefault(replica_id(), [])
  named = claimed_names(tf.compat.v1.get_default_graph()).difference(
      *handed.values())
  number, name = 0, DEFAULT_NAME
  while name in named or name in mine:
    number += 1
    name = f"{DEFAULT_NAME}_{number}"
  mine.append(name)
  return name


def gradients_as_they_are(loss, var_list, options):
  """[(gradient, variable)] of one micro-batch's loss, as they are."""
  _checks.check_graph_mode()
  batch = micro_batch.of_loss(loss, var_list)
  var_list = batch.var_list or micro_batch.trainable_variables(loss)
  return list(zip(tf.compat.v1.gradients(loss, var_list, **options), var_list))


def gradient_options(gate_gradients, aggregation_method,
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


def loss_reduction():
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
