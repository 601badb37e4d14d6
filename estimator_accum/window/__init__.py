"""The window core: k micro-batches accumulated and applied as one batch.

`train_op.build_accumulating_train_op` checks what the graph gives and builds
a `window.Window` over one accumulator per trained variable
(`accumulators.Accumulator`, or `compact.CompactSparseAccumulator` for huge
tables), with the reduction the options chose (`reductions.py`).
"""
