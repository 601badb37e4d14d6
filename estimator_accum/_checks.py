"""Argument checks for the public API.

Every check raises `TypeError` for a wrong type and `ValueError` for a wrong
value; the message names the argument, shows the value, and says what would be
accepted. They run while the graph is built, before any TensorFlow op sees the
value, so a user never gets a traceback from deep inside TensorFlow.
"""

import numbers
import re

import numpy as np
import tensorflow as tf
from absl import logging

from estimator_accum import releases, tf_private
from estimator_accum.checkpoints import function_variables
from estimator_accum.distribution import replicas

REDUCTIONS = ("mean", "sum", "running_mean")

# What tf.compat.v1.name_scope accepts as the first component of a root scope.
_SCOPE_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")


# The window counts its micro-batches in float32, exact up to 2**24.
MAX_K = 2**24


def session_config_copy(session_config):
  """A copy of `session_config` (a tf.compat.v1.ConfigProto), or None for
  None; anything else is a TypeError naming it."""
  if session_config is None:
    return None
  if not isinstance(session_config, tf.compat.v1.ConfigProto):
    raise TypeError(
        "session_config must be a tf.compat.v1.ConfigProto or None, got "
        f"{short(session_config)} of type {type(session_config).__name__}.")
  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(session_config)
  return config


def check_k(k):
  """Returns `k` as a Python int after checking it is an integer in
  1..MAX_K."""
  if isinstance(k, bool) or not isinstance(k, numbers.Integral):
    raise TypeError(
        f"k must be a Python int (the number of micro-batches per update), "
        f"got {k!r} of type {type(k).__name__}.")
  if k < 1:
    raise ValueError(f"k must be >= 1 (micro-batches per update), got {k!r}.")
  if k > MAX_K:
    raise ValueError(
        f"k must be at most {MAX_K} (2**24, the micro-batch counts are exact "
        f"float32 up to there), got {short(k)}.")
  return int(k)


def check_positive_int(argument, value, limit=MAX_K):
  """Returns `value` as an int after checking it is an integer in
  1..limit; the error names `argument`."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{argument} must be an int, got {short(value)} of type "
                    f"{type(value).__name__}.")
  if not 1 <= value <= limit:
    raise ValueError(f"{argument} must be in 1..{limit}, got {short(value)}.")
  return int(value)


def short(value, limit=60):
  """repr(value), cut to `limit` characters."""
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def check_max_skipped(value):
  """Returns max_consecutive_skipped_windows: None or an int in 1..2**31."""
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f"max_consecutive_skipped_windows must be an int or None, got "
        f"{short(value)} of type {type(value).__name__}.")
  if not 1 <= value <= 2**31:
    raise ValueError(
        f"max_consecutive_skipped_windows must be in 1..{2**31} (or None to "
        f"never stop), got {short(value)}.")
  return int(value)


def require_scalar(argument, tensor, hint):
  """Raises ValueError unless `tensor` has rank 0 (or an unknown rank)."""
  if tensor.shape.rank is not None and tensor.shape.rank != 0:
    raise ValueError(f"{argument} must be a scalar (rank 0), got shape "
                     f"{tensor.shape} {hint}.")


def check_not_eager():
  """Raises RuntimeError when called eagerly: the window is built in a
  graph, a tf.compat.v1 one or a tf.function's."""
  if tf.executing_eagerly():
    raise RuntimeError(
        "gradient accumulation was called eagerly; it builds the window in a "
        "graph: a model_fn, a tf.compat.v1 graph, or a tf.function (Keras's "
        "model.fit builds its train step in one: compile without "
        "run_eagerly=True; a custom training loop: call the optimizer in a "
        "tf.function).")


def check_not_xla():
  """Raises RuntimeError when the graph being built is compiled by XLA
  (Keras's `compile(jit_compile=True)`): the window's warnings, progress
  line and per-replica apply are host work XLA cannot compile. (TensorFlow
  has no public test of it: its control-flow context is asked.)"""
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    context = tf_private.control_flow_context(graph)
    while context is not None:
      if type(context).__name__ == "XLAControlFlowContext":
        raise RuntimeError(
            "gradient accumulation cannot be compiled with XLA (Keras's "
            "compile(jit_compile=True), or a tf.function(jit_compile=True)): "
            "compile with jit_compile=False; the window's end runs once per "
            "window and costs little outside XLA.")
      context = context.outer_context
    graph = getattr(graph, "outer_graph", None)


def check_graph_mode():
  """Raises RuntimeError when called eagerly or inside a tf.function: the
  train op is an op of a tf.compat.v1 graph, run once per micro-batch.
  Inside a tf.function, an optimizer wrapper may build its window
  (`FunctionVariables.building`): its variables are then made once."""
  if function_variables.building_in_function():
    check_not_xla()
    return
  if tf.executing_eagerly():
    raise RuntimeError(
        "build_accumulating_train_op builds a tf.compat.v1 graph; call it in a "
        "model_fn or under `with tf.Graph().as_default():`, not eagerly.")
  if tf.compat.v1.get_default_graph().building_function:
    raise RuntimeError(
        "build_accumulating_train_op builds a tf.compat.v1 graph, and was "
        "called inside a tf.function (Keras's model.fit in TensorFlow 2 "
        "mode builds its train step in one): call it in a model_fn, give a "
        "Keras model to an Estimator with "
        "tf.keras.estimator.model_to_estimator, or run Keras in graph mode "
        "(tf.compat.v1.disable_v2_behavior() before building the model).")


def check_loss(loss):
  """Checks that `loss` is a floating-point scalar graph tensor."""
  if not isinstance(loss, tf.Tensor) or not hasattr(loss, "op"):
    raise TypeError(
        f"loss must be a scalar floating-point tf.Tensor, got {loss!r} "
        f"of type {type(loss).__name__}.")
  if not loss.dtype.is_floating:
    raise TypeError(
        f"loss must have a floating-point dtype, got {loss.dtype.name} "
        f"for {loss.name}.")
  require_scalar("loss", loss, f"for {loss.name}; reduce it first, e.g. "
                  "tf.reduce_mean(per_example_loss)")


def check_optimizer_under_strategy(optimizer):
  """Refuses an optimizer that TensorFlow cannot run under the current
  distribution strategy (replica context of a model_fn)."""
  if not replicas.has_strategy():
    return
  if isinstance(optimizer, tf.compat.v1.train.ProximalAdagradOptimizer):
    strategy = replicas.strategy_name()
    raise TypeError(
        f"optimizer ProximalAdagradOptimizer cannot run under {strategy}: "
        "TensorFlow 2.15 builds its slots colocated with a mirrored variable "
        "and fails (plain optimizer.minimize fails the same way). Use "
        "FtrlOptimizer or ProximalGradientDescentOptimizer for l1/l2 "
        "regularization, AdagradOptimizer, or train it on one device or with "
        "parameter servers.")


def check_keras_2(what, argument, value, under_keras_3=None):
  """Refuses the Keras integration `what` (its `argument` given `value`)
  where `tf.keras` is Keras 3 (TensorFlow 2.16+'s default), which it does
  not run on, in one line that says what does (`under_keras_3`: what runs
  there instead, if anything)."""
  if releases.keras_major() < 3:
    return
  instead = under_keras_3 or (
      "use Keras 3's own gradient_accumulation_steps (docs/releases.md says "
      "how they differ)")
  raise TypeError(
      f"{what} runs on Keras 2, and tf.keras is Keras "
      f"{tf.keras.__version__} here (TensorFlow {tf.__version__}); got "
      f"{argument} {short(value)}. Install tf-keras (pip install "
      f"'tf-keras~={tf.__version__.rsplit('.', 1)[0]}.0') and set "
      f"TF_USE_LEGACY_KERAS=1 before importing TensorFlow, or {instead}.")


def check_optimizer(optimizer):
  """Checks that `optimizer` is an optimizer the accumulation can drive."""
  v1_optimizer = tf.compat.v1.train.Optimizer
  keras_legacy = releases.keras_legacy_optimizer_types()
  if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
    raise TypeError(
        "optimizer SyncReplicasOptimizer cannot be accumulated: it gathers "
        "every worker's gradients and increments global_step itself, where "
        "accumulation counts micro-batches with global_step. For synchronous "
        "training on several workers use MultiWorkerMirroredStrategy; with "
        "parameter servers, pass its inner optimizer (each worker then "
        "applies its own window).")
  if getattr(optimizer, "accumulates_micro_batches", False):
    raise TypeError(
        f"optimizer {type(optimizer).__name__} already accumulates k "
        "micro-batches; pass its inner optimizer, or call its minimize "
        "instead of accumulating again.")
  if isinstance(optimizer, (v1_optimizer, *keras_legacy)):
    return
  if isinstance(optimizer, tf.keras.optimizers.Optimizer):
    # TensorFlow 2 (eager, or a tf.function): an optimizer wrapper builds
    # its window inside the tf.function, where these optimizers run.
    if tf.compat.v1.executing_eagerly_outside_functions():
      return
    raise TypeError(
        f"optimizer {type(optimizer).__name__} is a Keras optimizer of the new "
        "kind, which does not run in tf.compat.v1 graphs; use its "
        "tf.keras.optimizers.legacy counterpart or a tf.compat.v1.train "
        "optimizer (in TensorFlow 2 mode, AccumulatingKerasOptimizer takes "
        "it).")
  raise TypeError(
      f"optimizer must be a tf.compat.v1.train.Optimizer or a "
      f"tf.keras.optimizers.legacy.Optimizer, got {optimizer!r} of type "
      f"{type(optimizer).__name__}.")


def warn_bypassed_compute_gradients(optimizer):
  """Warns when `optimizer` changes how gradients are computed: the window
  takes them from tf.gradients of the loss, as one big batch's would be, and
  never calls the optimizer's compute_gradients."""
  base = tf.compat.v1.train.Optimizer.compute_gradients
  if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
    return
  owner = type(optimizer).compute_gradients
  if owner is base:
    return
  logging.warning(
      "gradient accumulation: optimizer %s overrides compute_gradients, which "
      "accumulation does not call: the gradients come from tf.gradients of "
      "the loss, and whatever its compute_gradients adds (noise, an "
      "all-reduce, clipping) is not applied. Apply it to the loss, or use "
      "clip_norm for clipping.", type(optimizer).__name__)


def check_clip_norm(clip_norm):
  """Returns `clip_norm` as a float (or None) after checking it is > 0."""
  if clip_norm is None:
    return None
  if isinstance(clip_norm, bool) or not isinstance(clip_norm, numbers.Real):
    raise TypeError(
        f"clip_norm must be a positive number or None, got {clip_norm!r} of "
        f"type {type(clip_norm).__name__}.")
  if not clip_norm > 0 or clip_norm == float("inf"):
    raise ValueError(
        f"clip_norm must be a finite number > 0 or None, got {clip_norm!r}.")
  return float(clip_norm)


def check_global_step(global_step):
  """Checks that `global_step` is None or a scalar integer tf.Variable."""
  if global_step is None:
    return
  if not isinstance(global_step, tf.Variable):
    raise TypeError(
        f"global_step must be a scalar integer tf.Variable (it is incremented "
        f"every micro-batch) or None, got {global_step!r} of type "
        f"{type(global_step).__name__}.")
  if not global_step.dtype.base_dtype.is_integer:
    raise TypeError(
        f"global_step must be an integer variable, got dtype "
        f"{global_step.dtype.name} for {global_step.name}.")
  require_scalar("global_step", global_step, f"for {global_step.name}")


def check_bool(argument, value):
  """Raises TypeError unless `value` is a bool (Python's or numpy's)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{argument} must be True or False, got {value!r} of type "
                    f"{type(value).__name__}.")


def check_name(name):
  """Checks that `name` can prefix the state variables and the ops."""
  if not isinstance(name, str):
    raise TypeError(f"name must be a str, got {name!r} of type "
                    f"{type(name).__name__}.")
  if not _SCOPE_NAME.match(name) or name.endswith("/"):
    raise ValueError(
        f"name must be a non-empty scope name (letters, digits and . _ - / >, "
        f"not starting with _ - / or >, not ending with /), got {name!r}.")


def check_log_every(every_n):
  """Checks `log_every_n_micro_batches`: an int >= 1, or None for no line."""
  if every_n is None:
    return None
  if isinstance(every_n, bool) or not isinstance(every_n, numbers.Integral):
    raise TypeError(
        f"log_every_n_micro_batches must be an int, or None for no progress "
        f"line, got {every_n!r} of type {type(every_n).__name__}.")
  if every_n < 1:
    raise ValueError(
        f"log_every_n_micro_batches must be >= 1, or None for no progress "
        f"line, got {every_n!r}.")
  return int(every_n)


def summed_loss_reduction():
  """The reduction the graph's last loss was summed over its batch with
  (`tf.compat.v1.losses.Reduction.SUM`, Keras' "sum"), or None. TensorFlow's
  own v1 optimizers read this to decide whether to divide by the replicas."""
  last = tf_private.last_loss_reduction(tf.compat.v1.get_default_graph())
  return last if last in (tf.compat.v1.losses.Reduction.SUM, "sum") else None


def warn_of_summed_loss(reduction):
  """Warns, for a window whose `reduction` averages micro-batch losses, when
  they are sums: that trains as the big batch's summed loss divided by k."""
  summed = summed_loss_reduction()
  if summed is not None:
    logging.warning(
        "gradient accumulation: the last loss built in this graph is summed "
        "over its batch (tf.compat.v1.losses reduction %s), and "
        "reduction=%r averages the window's micro-batches: if that is "
        "the loss trained, the update is the big batch's divided by k; pass "
        "reduction='sum'.", summed, reduction)


def check_reduction(reduction):
  """Checks that `reduction` names a supported window reduction."""
  if reduction not in REDUCTIONS:
    raise ValueError(
        f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}.")


def check_accumulator_dtype(dtype):
  """Returns `dtype` as a floating tf.DType."""
  try:
    dtype = tf.as_dtype(dtype)
  except TypeError as error:
    raise TypeError(
        f"accumulator_dtype must be a floating-point dtype, got {dtype!r}."
    ) from error
  if not dtype.is_floating:
    raise TypeError(
        f"accumulator_dtype must be a floating-point dtype, got {dtype.name}.")
  return dtype
