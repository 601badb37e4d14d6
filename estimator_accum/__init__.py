"""Gradient accumulation for TensorFlow 1-style graphs and tf.estimator.

k micro-batches of B train exactly as one batch of k*B would, on one device,
under MirroredStrategy and MultiWorkerMirroredStrategy, and on
parameter-server workers. See `build_accumulating_train_op`.
"""

from estimator_accum.accumulators import Accumulator
from estimator_accum.batch_norm import adjusted_momentum, batch_norm
from estimator_accum.hooks import AccumulationLoggingHook
from estimator_accum.keras_optimizer import AccumulatingKerasOptimizer
from estimator_accum.optimizer import AccumulatingOptimizer
from estimator_accum.planner import (
    MicroBatchPlan,
    estimator_step,
    measure_peak,
    plan_micro_batch,
    window_batches,
)
from estimator_accum.replan import (
    OutOfMemory,
    halve_checkpoint,
    train_halving_on_oom,
)
from estimator_accum.sparse import (
    SPARSE_THRESHOLD_BYTES,
    CompactSparseAccumulator,
)
from estimator_accum.step_counting import update_count
from estimator_accum.train_op import (
    AccumulationState,
    build_accumulating_train_op,
    get_accumulation_state,
)
from estimator_accum.window_reports import is_divergence, reportable_loss

__all__ = [
    "AccumulatingKerasOptimizer",
    "AccumulatingOptimizer",
    "Accumulator",
    "MicroBatchPlan",
    "OutOfMemory",
    "CompactSparseAccumulator",
    "SPARSE_THRESHOLD_BYTES",
    "AccumulationLoggingHook",
    "AccumulationState",
    "adjusted_momentum",
    "batch_norm",
    "estimator_step",
    "halve_checkpoint",
    "measure_peak",
    "plan_micro_batch",
    "train_halving_on_oom",
    "window_batches",
    "build_accumulating_train_op",
    "get_accumulation_state",
    "is_divergence",
    "reportable_loss",
    "update_count",
]
