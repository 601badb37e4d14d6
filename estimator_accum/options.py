"""The options of one accumulation window, checked once into a frozen value.

`build_accumulating_train_op` and the optimizer wrappers turn their keyword
arguments into a `WindowSettings` with `WindowSettings.checked(...)`; the
train op, the `Window` that builds its graph, and the reports read that one
value. A new option is a field here, its check in `checked`, and the code
that reads it: no signature in between changes.
"""

from __future__ import annotations

import dataclasses
import types

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.distribution import replicas
from estimator_accum.window.compact import SPARSE_THRESHOLD_BYTES

# See build_accumulating_train_op's max_consecutive_skipped_windows.
DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS = 25
DEFAULT_NAME = "gradient_accumulation"
# Packs of the window's all-reduce when no CommunicationOptions are given;
# see window.py.
BYTES_PER_PACK = 4 * 2**20


@dataclasses.dataclass(frozen=True)
class WindowSettings:
  """What `build_accumulating_train_op` documents, per argument, checked.

  Fields are those arguments of the same names; `gradient_options` are the
  `tf.gradients` arguments for the loss (colocate_gradients_with_ops, and
  optionally grad_ys, aggregation_method, gate_gradients), read-only.
  """

  k: int
  reduction: str = "mean"
  clip_norm: float | None = None
  accumulator_dtype: tf.DType = tf.float32
  summaries: bool = True
  loss_scale: object = None
  sparse_accumulation: object = "auto"
  sparse_threshold_bytes: int = SPARSE_THRESHOLD_BYTES
  communication_options: object = None
  after_update: object = None
  log_every_n_micro_batches: int | None = 100
  max_consecutive_skipped_windows: int | None = (
      DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS)
  name: str = DEFAULT_NAME
  gradient_options: types.MappingProxyType = dataclasses.field(
      default_factory=lambda: types.MappingProxyType(
          {"colocate_gradients_with_ops": False}))

  @classmethod
  def checked(cls, k, **options):
    """A WindowSettings of `k` and `options` (the fields' names), each
    checked: TypeError or ValueError naming the argument and the value."""
    unknown = set(options) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise TypeError(f"unknown window settings: {sorted(unknown)}")
    settings = cls(k=_checks.check_k(k), **options)
    return dataclasses.replace(settings, **_checked_fields(settings))

  def replace(self, **changes):
    """A copy with `changes`, checked as `checked` checks them."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    return WindowSettings.checked(**dict(fields, **changes))


def _checked_fields(settings):
  """The fields of `settings` after their checks (normalized values), in
  the order the arguments have always been checked in."""
  clip_norm = _checks.check_clip_norm(settings.clip_norm)
  _checks.check_reduction(settings.reduction)
  _checks.check_bool("summaries", settings.summaries)
  gradient_options = dict(settings.gradient_options)
  _checks.check_bool("colocate_gradients_with_ops",
                     gradient_options["colocate_gradients_with_ops"])
  _checks.check_name(settings.name)
  checked = dict(
      clip_norm=clip_norm,
      log_every_n_micro_batches=_checks.check_log_every(
          settings.log_every_n_micro_batches),
      max_consecutive_skipped_windows=_checks.check_max_skipped(
          settings.max_consecutive_skipped_windows),
      accumulator_dtype=_checks.check_accumulator_dtype(
          settings.accumulator_dtype),
      communication_options=replicas.communication_options(
          settings.communication_options, BYTES_PER_PACK),
      gradient_options=types.MappingProxyType(gradient_options))
  if settings.after_update is not None and not callable(
      settings.after_update):
    raise TypeError(
        f"after_update must be a callable with no arguments or None, got "
        f"{settings.after_update!r} of type "
        f"{type(settings.after_update).__name__}.")
  return checked
