"""Checks of what a micro-batch trains: the variables, the gradients
given for them, their names, reference variables, and the micro-batch's
example count. Each raises TypeError or ValueError in one line naming the
argument and the value (as `estimator_accum/_checks.py`'s)."""

import tensorflow as tf

from estimator_accum import _checks, releases
from estimator_accum.checkpoints import state_variables

__all__ = ["check_distinct_names", "check_grads_and_vars",
           "check_num_examples", "check_ref_variables", "check_var_list",
           "reference_variable_names"]


def check_var_list(var_list):
  """Returns `var_list` as a list of variables, checking every element."""
  if var_list is None:
    return None
  if isinstance(var_list, (tf.Variable, str)) or not hasattr(
      var_list, "__iter__"):
    raise TypeError(
        f"var_list must be a list of tf.Variable or None, got {var_list!r}.")
  var_list = list(var_list)
  for position, var in enumerate(var_list):
    if not isinstance(var, tf.Variable):
      raise TypeError(
          f"var_list[{position}] must be a tf.Variable, got {var!r} of type "
          f"{type(var).__name__}.")
  if not var_list:
    raise ValueError("var_list is empty; pass None to train every trainable "
                     "variable or a non-empty list.")
  first_position = {}
  for position, var in enumerate(var_list):
    earlier = first_position.setdefault(id(var), position)
    if earlier != position:
      raise ValueError(
          f"var_list holds {var.name} twice (var_list[{earlier}] and "
          f"var_list[{position}]); list each variable once.")
  return var_list


def check_grads_and_vars(grads_and_vars):
  """Returns `grads_and_vars` as a list of (gradient or None, variable)."""
  if isinstance(grads_and_vars, (tf.Tensor, tf.Variable, str)) or not hasattr(
      grads_and_vars, "__iter__"):
    raise TypeError(
        f"grads_and_vars must be a list of (gradient, variable) pairs, as "
        f"compute_gradients returns, got {grads_and_vars!r}.")
  grads_and_vars = list(grads_and_vars)
  if not grads_and_vars:
    raise ValueError("grads_and_vars is empty: no variables to train.")
  for position, pair in enumerate(grads_and_vars):
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise TypeError(
          f"grads_and_vars[{position}] must be a (gradient, variable) pair, "
          f"got {pair!r}.")
    gradient, var = pair
    if not isinstance(var, tf.Variable):
      raise TypeError(
          f"grads_and_vars[{position}][1] must be a tf.Variable, got {var!r} "
          f"of type {type(var).__name__}.")
    if gradient is None:
      continue
    if not isinstance(gradient, (tf.Tensor, tf.IndexedSlices)):
      raise TypeError(
          f"the gradient of {var.name} in grads_and_vars must be a tf.Tensor, "
          f"a tf.IndexedSlices or None, got {gradient!r} of type "
          f"{type(gradient).__name__}.")
    if not gradient.dtype.is_floating:
      raise TypeError(
          f"the gradient of {var.name} in grads_and_vars must be "
          f"floating-point, got {gradient.dtype.name}.")
  first_position = {}
  for position, (_, var) in enumerate(grads_and_vars):
    earlier = first_position.setdefault(id(var), position)
    if earlier != position:
      raise ValueError(
          f"grads_and_vars holds {var.name} twice (grads_and_vars[{earlier}] "
          f"and grads_and_vars[{position}]); list each variable once.")
  return [tuple(pair) for pair in grads_and_vars]


def check_distinct_names(trained):
  """Refuses trained variables that share the name the window keys their
  state by (accumulators, row masks): two sharing one would share their
  state, silently, or fail deep in TensorFlow. `name_window_state` gives
  each a name of its own first; this holds it to that."""
  seen = {}
  for _, variable in trained:
    name = state_variables.variable_base_name(variable)
    if name in seen and seen[name] is not variable:
      raise ValueError(
          f"two trained variables are named {name!r} (shapes "
          f"{seen[name].shape} and {variable.shape}): the window keeps each "
          "one's state under its name. Give the variables distinct names.")
    seen[name] = variable


def reference_variable_names(variables):
  """The names of those of `variables` that are reference (non-resource)
  variables: their dtype is a `_ref` one."""
  return [v.name for v in variables if v.dtype != v.dtype.base_dtype]


def check_ref_variables(trained, optimizer):
  """Refuses reference variables where they cannot be trained: under control
  flow v2, which cannot update them inside a cond, and with a Keras
  optimizer, whose slots cannot be made for them (TensorFlow fails in plain
  `apply_gradients` too). TF 2's default variables are resource variables."""
  refs = reference_variable_names(v for _, v in trained)
  if not refs:
    return
  shown = ", ".join(refs[:3]) + (f" and {len(refs) - 3} more"
                                 if len(refs) > 3 else "")
  if isinstance(optimizer, releases.keras_legacy_optimizer_types()):
    raise ValueError(
        f"var_list holds reference variables ({shown}), for which the Keras "
        f"optimizer {type(optimizer).__name__} cannot create its slots "
        "(TensorFlow's own apply_gradients fails on them too). Create them as "
        "resource variables (use_resource=True, the default unless "
        "tf.compat.v1.disable_v2_behavior() or disable_resource_variables() "
        "was called), or use a tf.compat.v1.train optimizer.")
  if tf.compat.v1.control_flow_v2_enabled():
    raise ValueError(
        f"var_list holds reference variables ({shown}), which control flow "
        "v2 (TensorFlow 2's default) cannot update inside the window's "
        "tf.cond. Create them as resource variables (use_resource=True, the "
        "default unless tf.compat.v1.disable_v2_behavior() or "
        "disable_resource_variables() was called), or build with control "
        "flow v1 (tf.compat.v1.disable_control_flow_v2(), which "
        "disable_v2_behavior() also does).")


def check_num_examples(num_examples):
  """Checks that `num_examples` is None or a numeric scalar tensor."""
  if num_examples is None:
    return None
  if isinstance(num_examples, bool):
    raise TypeError(f"num_examples must be a scalar tensor, got {num_examples!r}.")
  try:
    num_examples = tf.convert_to_tensor(num_examples)
  except (TypeError, ValueError) as error:
    raise TypeError(
        f"num_examples must be a numeric scalar tensor, got {num_examples!r}."
    ) from error
  if not (num_examples.dtype.is_integer or num_examples.dtype.is_floating):
    raise TypeError(
        f"num_examples must be an integer or float scalar tensor, got dtype "
        f"{num_examples.dtype.name}.")
  _checks.require_scalar("num_examples", num_examples,
                  "; pass the size of this micro-batch, e.g. "
                  "tf.shape(labels)[0]")
  return num_examples
