"""Gradient accumulation for TensorFlow 1-style graphs and tf.estimator.

k micro-batches of B train exactly as one batch of k*B would, on one device,
under MirroredStrategy and MultiWorkerMirroredStrategy, and on
parameter-server workers. See `build_accumulating_train_op`.
"""

# First: a missing or unsupported TensorFlow is named in one line.
from estimator_accum import releases  # noqa: F401
from estimator_accum.checkpoints.saver_hook import LeanCheckpointSaverHook

# The kinds around a tf.keras.optimizers.Optimizer and a legacy one
# (AccumulatingKerasOptimizer makes one of its subclasses).
from estimator_accum.integrations import (  # noqa: F401
  keras_optimizer_legacy,
  keras_optimizer_v3,
)
from estimator_accum.integrations.hooks import (
  AccumulationLoggingHook,
  EveryStepSummaryHook,
)
from estimator_accum.integrations.input_options import without_autotune
from estimator_accum.integrations.keras_optimizer import (
  AccumulatingKerasOptimizer,
)
from estimator_accum.integrations.optimizer import AccumulatingOptimizer
from estimator_accum.integrations.session_config import lean_grappler
from estimator_accum.integrations.window_trace import WindowTraceHook

# The layer and the callback of the Keras `tf.keras` is: Keras 3's
# (TensorFlow 2.16+'s default) or Keras 2's (2.15, or tf-keras).
if releases.keras_major() >= 3:
  from estimator_accum.integrations.keras3_backup import BackupAndRestore
  from estimator_accum.integrations.keras3_batch_norm import (
      WindowBatchNormalization,
  )
else:
  from estimator_accum.integrations.keras_backup import BackupAndRestore
  from estimator_accum.integrations.keras_batch_norm import (
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

__all__ = [
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
