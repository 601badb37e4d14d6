"""The window core: k micro-batches accumulated and applied as one batch.

Every front door hands in a `micro_batch.MicroBatch`, checked once;
`train_op.accumulating_train_op`, the one builder, makes the build's
`plan.WindowPlan` once, and a `window.Window` that drives its four parts
with it: `accumulate.Accumulation` (the sums), `communication.Communication`
(what crosses replicas), `finish.Finish` (the gradient formed, clipped and
applied) and `bookkeeping.Bookkeeping` (position, counters, progress).
"""
