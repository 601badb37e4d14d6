#!/usr/bin/env bash
# Runs every benchmark in one go and prints the figures docs/benchmarks.md quotes.
#   benchmarks/run_all.sh | tee benchmarks/results.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
echo "# benchmarks/run_all.sh, $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m), $(nproc) cores"
echo
echo "## Cost per micro-batch (k=4; Adam, then SGD), variants interleaved micro-batch by micro-batch"
$PY benchmarks/accumulation_overhead.py --models mlp bert_small minilm
$PY benchmarks/accumulation_overhead.py --models bert_small --optimizer sgd
echo
echo "## Peak memory while training, k=4 (SGD: MLP at 3 widths and BERT-Small; then Adam; then Adam with control flow v1)"
$PY benchmarks/accumulation_overhead.py --memory --optimizer sgd \
  --models mlp mlp_2048 mlp_4096 bert_small
$PY benchmarks/accumulation_overhead.py --memory --models bert_small
$PY benchmarks/accumulation_overhead.py --memory --models bert_small --control_flow_v1
echo
echo "## Tensor memory (the BFC allocator a GPU uses), k=4, Adam"
$PY benchmarks/tensor_memory.py --models mlp bert_small minilm bert_base 2>/dev/null
echo
echo "## Memory and time per update against k"
$PY benchmarks/memory_vs_k.py --output docs/memory_vs_k.png
echo
echo "## Sparse gradients"
$PY benchmarks/sparse_accumulation.py
echo
echo "## A 1,000,000 x 64 table: compact against dense accumulators"
$PY benchmarks/huge_table.py
echo
echo "## The public recipe under MultiWorkerMirroredStrategy"
$PY benchmarks/recipe_comparison.py
echo
echo "## Time per window on 2 workers, k=8 (MLP micro-batch 64, then 256; BERT-Small micro-batch 8)"
$PY benchmarks/multiworker_window.py --micro_batch 64 2>/dev/null
$PY benchmarks/multiworker_window.py --micro_batch 256 2>/dev/null
$PY benchmarks/multiworker_window.py --model bert_small --windows 4 2>/dev/null
echo
echo "## Resident memory across repeated Estimator.train() calls (BERT-Small, Adam)"
$PY benchmarks/repeated_train.py --calls 8 2>/dev/null
$PY benchmarks/repeated_train.py --calls 8 --plain 2>/dev/null
echo
echo "## What accumulating itself costs, from traced op times (one thread, k=4)"
$PY benchmarks/window_ops.py 2>/dev/null
echo
echo "## The window's end against its floor (MiniLM's 22.7M parameters, AdamWeightDecay)"
$PY benchmarks/window_end.py 2>/dev/null
$PY benchmarks/xla_update.py 2>/dev/null
echo
echo "## Time per window on 2 workers, k=8, the reference interleaved in the same job (MLP micro-batch 64 and 256; BERT-Small micro-batch 8)"
$PY benchmarks/multiworker_interleaved.py --windows 16 2>/dev/null
$PY benchmarks/multiworker_interleaved.py --micro_batch 256 --windows 8 2>/dev/null
$PY benchmarks/multiworker_interleaved.py --model bert_small --windows 6 2>/dev/null
echo
echo "## The planner: budget -> micro-batch x k for an effective batch of 32, peak, time per update, weights against the big batch (MiniLM, BERT-Small)"
$PY benchmarks/plan_memory.py 2>/dev/null
echo
echo "## The BERT layer norm: centred form against tf.nn.moments, inference and training (MiniLM shape, 8 x 128)"
$PY benchmarks/layer_norm_speed.py 2>/dev/null
echo
echo "## The library's shape, read with ast"
$PY benchmarks/code_shape.py
echo
echo "## TensorFlow 2 Keras: the window against plain Keras at the big batch (optimizer x strategy x precision)"
$PY harness/keras_exactness.py 2>/dev/null
echo
echo "## TensorFlow 2 Keras, side by side: the window, gradient-accumulator 0.5.2, plain Keras at the micro-batch"
$PY benchmarks/keras_side_by_side.py --rounds 3 2>/dev/null
if [ "$(id -u)" = 0 ]; then
  echo
  echo "## The window across hosts (test bed, tc-shaped links)"
  $PY benchmarks/window_across_hosts.py --rates none,10gbit,1gbit,250mbit --windows 6 --heartbeat_seconds 60 2>/dev/null
  $PY benchmarks/overlap_trace.py --rate 1gbit --windows 4 2>/dev/null
fi
