"""Gradient accumulation for TensorFlow 1-style graphs and tf.estimator.

k micro-batches of B train exactly as one batch of k*B would, on one device,
under MirroredStrategy and MultiWorkerMirroredStrategy, and on
parameter-server workers. See `build_accumulating_train_op`.
"""

# First: a missing or unsupported TensorFlow is named in one line.
from estimator_accum import releases  # noqa: F401
from estimator_accum.checkpoints.full_disk import is_full_disk, remove_cut_saves
from estimator_accum.checkpoints.integrity import resume_from_complete
from estimator_accum.checkpoints.run_lock import hold as hold_run_lock
from estimator_accum.checkpoints.saver_hook import LeanCheckpointSaverHook
from estimator_accum.distribution import ports as _ports
from estimator_accum.distribution.health import coordination_heartbeat
from estimator_accum.distribution.health import watch as watch_cluster
from estimator_accum.estimator import (
  Estimator,
  EvalSpec,
  TrainSpec,
  train_and_evaluate,
)
from estimator_accum.integrations.hooks import (
  AccumulationLoggingHook,
  EveryStepSummaryHook,
)
from estimator_accum.integrations.input_options import without_autotune
from estimator_accum.integrations.optimizer import AccumulatingOptimizer
from estimator_accum.integrations.session_config import lean_grappler
from estimator_accum.integrations.window_trace import WindowTraceHook

# The optimizer, layer and callback of the Keras `tf.keras` is: Keras 3's
# (TensorFlow 2.16+'s default) or Keras 2's (2.15, or tf-keras).
from estimator_accum.keras import (
  AccumulatingKerasOptimizer,
  BackupAndRestore,
  WindowBatchNormalization,
)

# The planner's module, as `estimator_accum.planner` (DEFAULT_MARGIN,
# Measurement) for the scripts that read its plan files.
from estimator_accum.memory.recompute import recompute
from estimator_accum.planning import planner as planner
from estimator_accum.planning.planner import (
  MicroBatchPlan,
  estimator_step,
  measure_peak,
  own_threads,
  plan_micro_batch,
  window_batches,
)
from estimator_accum.planning.replan import (
  OutOfMemory,
  halve_checkpoint,
  train_halving_on_oom,
)
from estimator_accum.window.accumulators import Accumulator
from estimator_accum.window.batch_norm import adjusted_momentum, batch_norm
from estimator_accum.window.compact import (
  SPARSE_THRESHOLD_BYTES,
  CompactSparseAccumulator,
)
from estimator_accum.window.keyed_dropout import keyed_dropout
from estimator_accum.window.reports import is_divergence, reportable_loss
from estimator_accum.window.step_counting import update_count
from estimator_accum.window.train_op import (
  AccumulationState,
  build_accumulating_train_op,
  get_accumulation_state,
)
from estimator_accum.window.window_copies import cast_once_per_window

# A task of a TF_CONFIG cluster that no launcher closed has its port closed
# to all but its cluster before any server of it starts (nothing above
# starts one; estimator_accum/distribution/ports.py).
_ports.close_own_port()

__all__ = [
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "ModeKeys",
    "PredictOutput",
    "RunConfig",
    "ServingInputReceiver",
    "TrainSpec",
    "train_and_evaluate",
    "coordination_heartbeat",
    "hold_run_lock",
    "is_full_disk",
    "remove_cut_saves",
    "resume_from_complete",
    "watch_cluster",
    "AccumulatingKerasOptimizer",
    "AccumulatingOptimizer",
    "Accumulator",
    "MicroBatchPlan",
    "OutOfMemory",
    "CompactSparseAccumulator",
    "SPARSE_THRESHOLD_BYTES",
    "AccumulationLoggingHook",
    "EveryStepSummaryHook",
    "LeanCheckpointSaverHook",
    "WindowTraceHook",
    "AccumulationState",
    "BackupAndRestore",
    "adjusted_momentum",
    "batch_norm",
    "estimator_step",
    "halve_checkpoint",
    "measure_peak",
    "own_threads",
    "plan_micro_batch",
    "train_halving_on_oom",
    "window_batches",
    "build_accumulating_train_op",
    "cast_once_per_window",
    "get_accumulation_state",
    "is_divergence",
    "keyed_dropout",
    "lean_grappler",
    "recompute",
    "reportable_loss",
    "update_count",
    "WindowBatchNormalization",
    "without_autotune",
]


def __getattr__(name):
  # EstimatorSpec, ModeKeys, RunConfig: tf.estimator's on 2.15 (loaded when
  # first asked for), the library's on 2.16+.
  from estimator_accum import estimator  # noqa: PLC0415
  if name in estimator.RELEASE_TYPES:
    return getattr(estimator, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
