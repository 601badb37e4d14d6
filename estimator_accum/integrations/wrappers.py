"""What the optimizer wrappers share (internal to estimator_accum).

`Wrapper` is the part of `AccumulatingOptimizer` and
`AccumulatingKerasOptimizer` that serves their window's and inner
optimizer's state (slots, checkpoints); `WrapperWindow` holds a wrapper's
settings, checked when the wrapper is made, and builds its window in each
graph through `train_op.accumulating_train_op`.
"""

import tensorflow as tf

from estimator_accum import _checks, graph_state
from estimator_accum.checkpoints import object_checkpoints
from estimator_accum.checkpoints.state_variables import (
  state_variable,
)
from estimator_accum.distribution.replicas import replica_id
from estimator_accum.options import (
  DEFAULT_NAME,
  DEFAULTS,
  OPTION_NAMES,
  WindowSettings,
  config_value,
)
from estimator_accum.window import loss_scale as _loss_scale
from estimator_accum.window import progress
from estimator_accum.window.train_op import accumulating_train_op, claimed_names

_GATES = (tf.compat.v1.train.Optimizer.GATE_NONE,
          tf.compat.v1.train.Optimizer.GATE_OP,
          tf.compat.v1.train.Optimizer.GATE_GRAPH)


class Wrapper:
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
      return self._window.checkpoints.slot(var, name)
    return self._window.optimizer.get_slot(var, name)

  def get_slot_names(self):
    """The inner optimizer's slot names and the window's, in this graph."""
    return (list(self._window.optimizer.get_slot_names()) +
            self._window.checkpoints.slot_names())

  def _create_or_restore_slot_variable(self, slot_variable_position,
                                       slot_name, variable):
    # A checkpoint restored before the window is built (Keras's
    # load_weights before fit) hands the slots it holds under the wrapper
    # to the optimizer that will make them, and the window's to the window.
    if slot_name.startswith(object_checkpoints.WINDOW_SLOT_PREFIX):
      return self._window.checkpoints.restore_slot(
          slot_variable_position, slot_name, variable)
    return self._window.optimizer._create_or_restore_slot_variable(
        slot_variable_position, slot_name, variable)

  def _lookup_dependency(self, name, cached_dependencies=None):
    # Window state a checkpoint holds that this window does not have is
    # refused, not dropped (and state keyed as before is found).
    found = super()._lookup_dependency(name, cached_dependencies)
    if found is None:
      found = self._window.checkpoints.lookup(name)
    return found


# The wrappers' defaults of the window options, where they are not the
# table's: left to each graph.
WRAPPER_DEFAULTS = {"reduction": None, "name": None}


class WrapperWindow:
  """The settings of a wrapper's window, checked when the wrapper is made,
  and the window built from them in each graph."""

  def __init__(self, optimizer, k, defaults, options):
    """`options`: the window options given (`options.OPTIONS`), over the
    wrapper's `defaults` of them, over the table's. `reduction` and `name`
    may be None, left to each graph (the loss's own reduction, the next
    default name), and are checked in their defaults' place."""
    self._given = {**DEFAULTS, **defaults, **options}
    self._settings = WindowSettings.checked(
        k, **dict(self._given, reduction=self._given["reduction"] or "mean",
                  name=self._given["name"] or DEFAULT_NAME))
    self.k = self._settings.k
    inner, _ = _loss_scale.unwrap_optimizer(optimizer,
                                            self._settings.loss_scale)
    _checks.check_optimizer(inner)
    self.optimizer = optimizer
    self.checkpoints = object_checkpoints.WrapperCheckpoints()
    # Values Keras's set_weights gave before the window was built.
    self.pending_weights = None

  def arguments(self):
    """The arguments that make an equal window: the optimizer, k and the
    options as given (the dtype by name; the communication options as
    given, which a config serializes)."""
    return dict(optimizer=self.optimizer, k=self.k, **{
        name: config_value(name, self._given[name]) for name in OPTION_NAMES})

  def reduction(self):
    """The window's reduction: the given one, else the loss's own."""
    return self._given["reduction"] or loss_reduction()

  def train_op(self, owner, loss, grads_and_vars, global_step, var_list=None,
               gradient_options=None, reduction=None):
    """The train op of one micro-batch, from its loss or its gradients.

    `owner`, the wrapper, then tracks the window's state variables and the
    inner optimizer's own (`WrapperCheckpoints.track`), so that object-based
    checkpoints of whatever tracks the wrapper (a Keras model compiled with
    it, as `model_to_estimator` and `save_weights` save them) hold the
    window and the optimizer's state, as name-based ones do.
    """
    _checks.check_graph_mode()
    name = self._name()
    variables = {}
    if global_step is None:
      global_step = state_variable(
          f"{name}/micro_batches", [], tf.int64, per_replica=False)
      variables[f"{name}/micro_batches"] = global_step
    settings = self._settings.replace(
        reduction=reduction or self.reduction(), name=name,
        gradient_options=(gradient_options or
                          dict(colocate_gradients_with_ops=False)))
    train_op, window = accumulating_train_op(
        loss, grads_and_vars, self.optimizer, settings,
        global_step=global_step, var_list=var_list)
    window_variables, slots = window.state_variables()
    variables.update(window_variables)
    if isinstance(global_step, tf.Variable):
      # The caller's counter (a Keras wrapper's `iterations`, Estimator's
      # global step) is part of the window's position.
      variables.setdefault("micro_batches", global_step)
    self.checkpoints.track(owner, self.optimizer, variables, slots, name)
    return train_op

  def _name(self):
    """The given name, or the next default name of this replica."""
    if self._given["name"] is not None:
      return self._given["name"]
    return next_default_name()


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
