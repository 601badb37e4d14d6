"""Loss scaling for float16 models, integrated with the window.

A float16 backward pass underflows small gradients to zero. Loss scaling
multiplies the loss by S before differentiating and divides the gradients by
S again, in float32, before they enter the float32 accumulators. The decision
what to do with a window is the window's: one whose gradient is not finite
(a micro-batch overflowed; Inf and NaN survive being summed) is skipped whole
and, with dynamic scaling, S is divided by `multiplier`; after
`increment_period` applied windows in a row, S is multiplied by it.

S lives in `<name>/loss_scale` and the run of good windows in
`<name>/good_windows`: both are in the checkpoint, so a restarted job goes on
with the scale it had.

Users can pass `loss_scale="dynamic"` or a number, or hand in a
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` or a Keras
`LossScaleOptimizer`: it is unwrapped and its settings are used here, so
that unscaling and the finiteness decision happen once per window, not once
per micro-batch (left wrapped, either would unscale, check and skip each
micro-batch inside the window on its own).
"""

import dataclasses
import numbers

import tensorflow as tf

from estimator_accum import keras_private, tf_private

_V1_WRAPPER = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
_V1_DYNAMIC = tf.compat.v1.mixed_precision.DynamicLossScale
_V1_FIXED = tf.compat.v1.mixed_precision.FixedLossScale


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
  """Initial scale and, for dynamic scaling, how it moves."""
  initial: float
  dynamic: bool
  increment_period: int = 2000
  multiplier: float = 2.0


def _keras_wrapper_types():
  try:
    return (tf.keras.mixed_precision.LossScaleOptimizer,)
  except AttributeError:  # pragma: no cover - Keras without mixed precision.
    return ()


def _from_v1_loss_scale(loss_scale):
  if isinstance(loss_scale, _V1_DYNAMIC):
    return LossScaleConfig(float(loss_scale.initial_loss_scale), True,
                           int(loss_scale.increment_period),
                           float(loss_scale.multiplier))
  if isinstance(loss_scale, _V1_FIXED):
    return LossScaleConfig(tf_private.fixed_loss_scale_value(loss_scale), False)
  raise TypeError(f"the loss-scale optimizer's loss scale {loss_scale!r} is "
                  f"neither dynamic nor fixed.")


# Ops looked at, at most, for a float16 tensor behind a loss.
_MAX_OPS = 100_000


def computed_in_float16(tensor):
  """Whether `tensor` (a loss, or a gradient) is computed through float16
  values: a mixed_float16 model's forward pass, whose gradients underflow
  unless the loss is scaled."""
  seen, pending = set(), [tensor.op]
  while pending and len(seen) < _MAX_OPS:
    op = pending.pop()
    if op in seen:
      continue
    seen.add(op)
    if any(t.dtype == tf.float16 for t in op.outputs):
      return True
    pending.extend(t.op for t in op.inputs)
  return False


def check_loss_scale(loss_scale, loss=None):
  """Returns a LossScaleConfig for loss_scale (None, "dynamic", "auto" or
  > 0) or None. "auto" is "dynamic" for a float16 model, as Keras's
  compile wraps the optimizer of a mixed_float16 model in a
  LossScaleOptimizer: when `loss` (or a gradient) is computed through
  float16 values, or, without it, while Keras's global dtype policy is
  mixed_float16; else None."""
  if loss_scale is None:
    return None
  if isinstance(loss_scale, str) and loss_scale == "auto":
    if loss is not None:
      mixed = computed_in_float16(loss)
    else:
      mixed = tf.keras.mixed_precision.global_policy().name == "mixed_float16"
    return check_loss_scale("dynamic" if mixed else None)
  if isinstance(loss_scale, str) and loss_scale == "dynamic":
    return LossScaleConfig(2.0 ** 15, True)
  if isinstance(loss_scale, (_V1_DYNAMIC, _V1_FIXED)):
    return _from_v1_loss_scale(loss_scale)
  if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real):
    raise TypeError(f"loss_scale must be None, 'dynamic', 'auto' or a number "
                    f"> 0, got {loss_scale!r}.")
  if not 0 < loss_scale < float("inf"):
    raise ValueError(f"loss_scale must be a finite number > 0, got "
                     f"{loss_scale!r}.")
  return LossScaleConfig(float(loss_scale), False)


def _from_keras_wrapper(optimizer):
  if keras_private.keras_loss_has_been_scaled(optimizer):
    raise ValueError(
        f"loss was scaled by the Keras {type(optimizer).__name__}'s "
        f"get_scaled_loss, and the window scales it again: pass the unscaled "
        f"loss (the library scales and unscales it with the optimizer's "
        f"settings).")
  if not optimizer.dynamic:
    return LossScaleConfig(float(optimizer.initial_scale), False)
  return LossScaleConfig(float(optimizer.initial_scale), True,
                         int(optimizer.dynamic_growth_steps))


def is_loss_scale_optimizer(optimizer):
  """Whether `optimizer` is a tf.compat.v1 or Keras loss-scale optimizer."""
  return isinstance(optimizer, (_V1_WRAPPER,) + _keras_wrapper_types())


def unwrap_optimizer(optimizer, loss_scale, loss=None):
  """Returns (inner optimizer, LossScaleConfig or None); `loss`, the loss
  or a gradient "auto" is read from (see `check_loss_scale`).

  A MixedPrecisionLossScaleOptimizer or a Keras LossScaleOptimizer is taken
  apart: its inner optimizer applies the window, its loss scale settings
  scale the loss. Wrapping twice, combining a wrapper with loss_scale=, or a
  loss already scaled by the Keras wrapper's get_scaled_loss is an error.
  """
  config = check_loss_scale(loss_scale, loss)
  wrappers = (_V1_WRAPPER,) + _keras_wrapper_types()
  if not is_loss_scale_optimizer(optimizer):
    return optimizer, config
  if isinstance(loss_scale, str) and loss_scale == "auto":
    config = None  # (the loss-scale optimizer given says how)
  if isinstance(optimizer, _V1_WRAPPER):
    inner, _ = tf_private.v1_loss_scale_parts(optimizer)
  else:
    inner = optimizer.inner_optimizer
  if isinstance(inner, wrappers):
    raise TypeError(
        f"optimizer is a {type(optimizer).__name__} wrapped around another "
        f"loss-scale optimizer ({type(inner).__name__}): the loss would be "
        f"scaled twice. Wrap the optimizer once.")
  if config is not None:
    raise ValueError(
        f"optimizer is a {type(optimizer).__name__} and loss_scale="
        f"{loss_scale!r} was given too: the loss would be scaled twice. Pass "
        f"one of them.")
  if isinstance(optimizer, _V1_WRAPPER):
    return inner, _from_v1_loss_scale(
        tf_private.v1_loss_scale_parts(optimizer)[1])
  return inner, _from_keras_wrapper(optimizer)


class LossScaler:
  """The scale variable, the scaled loss, unscaling and the scale update.

  Attributes:
    unscales: whether the window unscales the gradients it adds (it scaled
      the loss itself); False when the caller scaled the loss and unscaled
      its gradients with this scale (Keras's `get_scaled_loss` and
      `get_unscaled_gradients`), and the window only skips and moves it.
  """

  def __init__(self, config, name, variables, unscales=True):
    """`variables`: the build's `StateVariables` for shared state."""
    state_variable = variables
    self.config = config
    self.unscales = unscales
    scale_name, good_windows_name = self.variable_names(name)
    self.scale = state_variable(scale_name, [], tf.float32,
                                per_replica=False,
                                initial_value=config.initial)
    self.good_windows = None
    if config.dynamic:
      self.good_windows = state_variable(good_windows_name, [], tf.int64,
                                         per_replica=False)

  @staticmethod
  def variable_names(name):
    """The names of the scale and of its good windows, for the window
    `name`."""
    return name + "/loss_scale", name + "/good_windows"

  def state_variables(self):
    """The scale and its good windows, as made."""
    return [v for v in (self.scale, self.good_windows) if v is not None]

  def scale_loss(self, loss):
    return loss * tf.cast(self.scale.read_value(), loss.dtype)

  def inverse(self):
    """1/S as a float32 scalar, read once per micro-batch."""
    return tf.math.reciprocal(self.scale.read_value())

  def update(self, finite):
    """After a window (cross-replica context): move S; returns the op."""
    if not self.config.dynamic:
      return tf.no_op()
    config = self.config
    good = self.good_windows.read_value()
    scale = self.scale.read_value()
    grown = scale * config.multiplier
    grow = tf.logical_and(finite, good + 1 >= config.increment_period)
    new_scale = tf.where(
        finite,
        tf.where(tf.logical_and(grow, tf.math.is_finite(grown)), grown, scale),
        tf.maximum(scale / config.multiplier, 1.0))
    new_good = tf.where(tf.logical_and(finite, tf.logical_not(grow)),
                        good + 1, tf.zeros_like(good))
    return tf.group(self.scale.assign(new_scale, read_value=False),
                    self.good_windows.assign(new_good, read_value=False))
