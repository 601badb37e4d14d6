"""`AccumulationState`: what a built accumulation keeps, for hooks and tests
(public; `estimator_accum.get_accumulation_state()` returns it)."""

import collections

AccumulationState = collections.namedtuple(
    "AccumulationState",
    ["k", "global_step", "updates_applied", "skipped_windows",
     "applied_gradient_norm", "accumulators", "loss_scale", "examples"],
    defaults=[None])
AccumulationState.__doc__ = """What a built accumulation keeps, for hooks and tests.

Fields:
  k: int, micro-batches per update.
  global_step: the int64 variable counting micro-batches.
  updates_applied: int64 variable, windows applied so far.
  skipped_windows: int64 variable, windows skipped for NaN/Inf gradients.
  applied_gradient_norm: float32 variable, global norm of the last window's
    gradient (after the mean and the all-reduce, before clipping).
  accumulators: list of `Accumulator`, one per trained variable.
  loss_scale: float32 variable holding the loss scale, or None without loss
    scaling.
  examples: dict, replica id -> scalar tensor, for each replica on this
    worker: the examples in its micro-batch (`num_examples`, else the
    leading dimension of the input pipeline's batch), or None where that
    cannot be told. What `AccumulationLoggingHook` counts for examples/sec.
"""
