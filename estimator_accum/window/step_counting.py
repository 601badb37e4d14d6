"""Optimizers and schedules that read `global_step`, and `update_count`.

Under accumulation `global_step` counts micro-batches, k per update. An
optimizer whose update reads a step count (AdagradDA) or a learning rate
scheduled on the global step therefore sees k times the count big-batch
training would show it: silently different training. `update_count(k)` is
the count that matches big-batch training; tensors built from it are marked
here so that the checks can tell the two apart.
"""

import tensorflow as tf
from absl import logging

from estimator_accum import _checks, graph_state, tf_private
from estimator_accum._autograph import as_written

# Ops visited at most when looking for the global step among a
# hyperparameter's inputs: schedules are small graphs.
_MAX_OPS = 10_000
_MARK = "_estimator_accum_update_count"
# Attribute names of tf.compat.v1.train optimizers, as their arguments say.
_ARGUMENT_NAMES = {"lr": "learning_rate"}


def mark_update_count(tensor):
  """Marks `tensor` (the result of `update_count`) as counting updates."""
  setattr(tensor.op, _MARK, True)
  return tensor


def _step_ops(global_step):
  """The ops that hold `global_step` (each replica's, under a strategy)."""
  components = getattr(global_step, "values", None) or (global_step,)
  ops = set()
  for component in components:
    handle = getattr(component, "handle", None)
    # (A variable made eagerly, in TensorFlow 2, has no op.)
    if isinstance(handle, tf.Tensor) and hasattr(handle, "op"):
      ops.add(handle.op)
    op = getattr(component, "op", None)
    if isinstance(op, tf.Operation):
      ops.add(op)
  return ops


def counts_micro_batches(value, global_step):
  """Whether `value` is, or is computed from, `global_step` itself.

  Values computed through `update_count` count updates and are not. Returns
  False for anything that is not a graph tensor or variable of the global
  step's graph, and when the search is cut short.
  """
  step_ops = _step_ops(global_step)
  if value is global_step:
    return True
  if isinstance(value, tf.Variable) or hasattr(value, "values"):
    return bool(_step_ops(value) & step_ops)
  if not isinstance(value, tf.Tensor) or not hasattr(value, "op"):
    return False
  seen, stack = set(), [value.op]
  while stack and len(seen) < _MAX_OPS:
    op = stack.pop()
    if op in seen or getattr(op, _MARK, False):
      continue
    if op in step_ops:
      return True
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
  return False


def _hyperparameters(optimizer):
  """(name, value) of the optimizer's attributes that may be tensors."""
  for name, value in tf_private.tensor_attributes(optimizer).items():
    if name == "_global_step":
      continue
    if isinstance(value, (tf.Tensor, tf.Variable)):
      name = name.lstrip("_")
      yield _ARGUMENT_NAMES.get(name, name), value


def check_optimizer_steps(optimizer, global_step, k):
  """Refuses AdagradDA on micro-batches; warns of schedules that count them.

  Raises:
    ValueError: `optimizer` is an AdagradDAOptimizer given `global_step`,
      whose update would then use k times big-batch training's step count.
  """
  if k == 1:
    return
  if isinstance(optimizer, tf.compat.v1.train.AdagradDAOptimizer):
    step = tf_private.adagrad_da_global_step(optimizer)
    if counts_micro_batches(step, global_step):
      raise ValueError(
          f"optimizer AdagradDAOptimizer was given global_step "
          f"{getattr(step, 'name', step)!r}, which counts micro-batches "
          f"under accumulation: its update would use {k} times the step "
          "count of big-batch training. Build it with "
          f"global_step=estimator_accum.update_count({k}), the number of "
          "updates applied.")
  # Under MirroredStrategy every replica builds the train op, and one
  # warning says it.
  warned = graph_state.owned("warned_hyperparameters", set)
  for name, value in _hyperparameters(optimizer):
    if name not in warned and counts_micro_batches(value, global_step):
      warned.add(name)
      logging.warning(
          "gradient accumulation: the optimizer's %s is computed from "
          "global_step, which counts micro-batches here (%d per update): a "
          "schedule written for big-batch training runs %d times faster. "
          "If it should count updates, build it on "
          "estimator_accum.update_count(%d).", name, k, k, k)


@as_written
def update_count(k, global_step=None):
  """Returns the number of updates applied so far: `global_step // k`.

  Args:
    k: int >= 1, micro-batches per update, as given to
      `build_accumulating_train_op`.
    global_step: the micro-batch counter; default the graph's global step.

  Returns:
    int64 scalar tf.Tensor. Use it where a learning-rate schedule would use
    the global step of big-batch training.
  """
  k = _checks.check_k(k)
  if global_step is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
  return mark_update_count(
      tf.math.floordiv(tf.cast(global_step, tf.int64), k))
