"""Tensor memory of accumulating training against plain training, as a GPU
would hold it: TensorFlow's own allocator accounting, not the process.

The peak resident memory (`accumulation_overhead.py --memory`) counts the
whole process: the graph, its Python and C++ objects, the session's
executors, and the tensors. On a GPU only the tensors (variables, slots,
accumulators, activations, gradients, constants) are on the device, and
TensorFlow places them with a BFC allocator. Here the CPU device is given
the same BFC allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`), every micro-batch
is traced (`RunOptions.FULL_TRACE`), and the allocator's bytes in use after
every op are read from the step stats: their maximum in a micro-batch is that
micro-batch's peak of tensor memory, variables included. BFC hands out a
free chunk up to twice the size asked for, so the same micro-batch can
peak tens of MB higher or lower from one run to the next: both the highest
peak over two windows and the median of the micro-batches' peaks are
printed.

  python benchmarks/tensor_memory.py [--models mlp bert_small] [--k 4]
      [--optimizer adam] [--control_flow_v1]

Each variant runs in a process of its own, one thread, after a warm-up
window. Printed: the peaks of plain training and of accumulation, their
difference, and that difference against one float32 copy of the trainable
variables (the accumulators).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

_BFC = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.accumulation_overhead import (  # noqa: E402
    MODELS,
    OPTIMIZERS,
    build_graph,
)
from estimator_accum import own_threads  # noqa: E402
from harness import bench  # noqa: E402

VARIANTS = ("plain", "accum")


def _bytes_in_use(run_metadata):
  """The allocator's bytes in use after each op of one traced step."""
  return [memory.allocator_bytes_in_use
          for device in run_metadata.step_stats.dev_stats
          for node in device.node_stats for memory in node.memory
          if memory.allocator_bytes_in_use]


def measure_one(model_name, variant, k, optimizer_name):
  """In this process: the peak tensor bytes over two traced windows."""
  graph, train_op, trainable, accumulators, setup = build_graph(
      model_name, variant, k, optimizer_name)
  config = own_threads(tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=1, intra_op_parallelism_threads=1))
  options = tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  with tf.compat.v1.Session(graph=graph, config=config) as session:
    for op in setup:
      session.run(op)
    for _ in range(k):
      session.run(train_op)
    per_step = []
    for _ in range(2 * k):
      metadata = tf.compat.v1.RunMetadata()
      session.run(train_op, options=options, run_metadata=metadata)
      in_use = _bytes_in_use(metadata)
      if not in_use:
        raise RuntimeError(
            "no allocator statistics in the step stats: run with "
            "TF_CPU_ALLOCATOR_USE_BFC=true set before TensorFlow starts")
      per_step.append(max(in_use))
  return {"peak": max(per_step) / 2**20, "steps": [b / 2**20 for b in per_step],
          "trainable": trainable / 2**20, "accumulators": accumulators / 2**20}


def measure(model_name, variant, k=4, optimizer_name="adam",
            control_flow_v1=False):
  """Runs `measure_one` in a fresh process with the BFC allocator; returns
  {"peak": MB, "steps": [MB per micro-batch], "trainable": MB,
  "accumulators": MB}."""
  output = subprocess.run(
      [sys.executable, __file__, "--models", model_name, "--k", str(k),
       "--optimizer", optimizer_name, "--variant", variant]
      + (["--control_flow_v1"] if control_flow_v1 else []),
      capture_output=True, text=True, check=True,
      env=dict(os.environ, **_BFC))
  return json.loads(output.stdout.strip().splitlines()[-1])


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--models", nargs="+", default=["mlp", "bert_small"],
                      choices=list(MODELS))
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                      default="adam")
  parser.add_argument("--control_flow_v1", action="store_true",
                      help="build every graph with control flow v1")
  parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.control_flow_v1:
    tf.compat.v1.disable_control_flow_v2()
  if args.variant:
    print(json.dumps(measure_one(args.models[0], args.variant, args.k,
                                 args.optimizer)))
    return 0
  rows = bench.Rows(
      f"peak tensor memory (BFC allocator on CPU, as a GPU holds tensors; "
      f"bytes in use after every op), k={args.k}, {args.optimizer}, two "
      "traced windows after a warm-up; highest peak / median of the "
      "micro-batches' peaks", args.json, markdown=True,
      formats={"trainable MB": ".1f", "accumulators MB": ".1f"})
  for model_name in args.models:
    runs = {v: measure(model_name, v, args.k, args.optimizer,
                       args.control_flow_v1) for v in VARIANTS}
    accumulators = runs["accum"]["accumulators"]
    highest = {v: runs[v]["peak"] for v in VARIANTS}
    typical = {v: statistics.median(runs[v]["steps"]) for v in VARIANTS}
    extra = [figures["accum"] - figures["plain"]
             for figures in (highest, typical)]
    rows.add(**{
        "model": model_name, "trainable MB": runs["accum"]["trainable"],
        "accumulators MB": accumulators,
        "plain MB": f"{highest['plain']:.0f} / {typical['plain']:.0f}",
        "accumulation MB": f"{highest['accum']:.0f} / {typical['accum']:.0f}",
        "accumulation - plain MB": f"{extra[0]:.0f} / {extra[1]:.0f}",
        "(accumulation - plain) / accumulators":
            f"{extra[0] / accumulators:.2f} / {extra[1] / accumulators:.2f}"})
    print(f"#   peak per micro-batch, plain: "
          f"{' '.join(f'{b:.0f}' for b in runs['plain']['steps'])}; "
          f"accumulation: "
          f"{' '.join(f'{b:.0f}' for b in runs['accum']['steps'])}",
          flush=True)
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
