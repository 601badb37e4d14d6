"""Peak memory and time per update against k: micro-batch B with k-step
accumulation against one plain batch of k*B, BERT-Small at sequence length
128, Adam. Each point runs in a process of its own (peak RSS is per process).

  python benchmarks/memory_vs_k.py --output docs/memory_vs_k.png

Prints a table and writes a PNG of both curves, with the goal line
"k=1 plus one float32 copy of the variables".
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.accumulation_overhead import bert_small_loss  # noqa: E402
from harness import bench  # noqa: E402
from harness.memory import MALLOC_ENV, status_mb  # noqa: E402

MICRO_BATCH = 8


def measure(mode, k, updates=2):
  """In this process: (peak RSS MB, seconds per update, trainable MB)."""
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(0)
    batch = MICRO_BATCH * (k if mode == "big_batch" else 1)
    loss = bert_small_loss(batch_size=batch)
    optimizer = tf.compat.v1.train.AdamOptimizer(1e-4)
    if mode == "big_batch":
      train_op = optimizer.minimize(
          loss, tf.compat.v1.train.get_or_create_global_step())
      runs_per_update = 1
    else:
      train_op = estimator_accum.build_accumulating_train_op(
          loss, optimizer, k, summaries=False)
      runs_per_update = k
    trainable = sum(v.shape.num_elements() * 4
                    for v in tf.compat.v1.trainable_variables()) / 2**20
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(runs_per_update):  # Warm-up: one update.
        session.run(train_op)
      start = time.perf_counter()
      for _ in range(updates * runs_per_update):
        session.run(train_op)
      seconds = (time.perf_counter() - start) / updates
  peak = status_mb("VmHWM")
  return peak, seconds, trainable


def plot(rows, output):
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot

  ks = sorted({row["k"] for row in rows})
  by = {(row["mode"], row["k"]): row for row in rows}
  figure, (memory, speed) = pyplot.subplots(1, 2, figsize=(11, 4.5), dpi=100)
  for mode, label in (("accumulate", f"micro-batch {MICRO_BATCH} x k"),
                      ("big_batch", f"one batch of {MICRO_BATCH}·k")):
    memory.plot(ks, [by[mode, k]["peak_mb"] for k in ks], marker="o",
                label=label)
    speed.plot(ks, [by[mode, k]["seconds"] for k in ks], marker="o",
               label=label)
  goal = by["big_batch", 1]["peak_mb"] + by["big_batch", 1]["trainable_mb"]
  memory.axhline(goal, color="gray", linestyle="--",
                 label="k=1 + one copy of the variables")
  for axes, ylabel in ((memory, "peak resident memory (MB)"),
                       (speed, "seconds per update")):
    axes.set_xscale("log", base=2)
    axes.set_xticks(ks, [str(k) for k in ks])
    axes.set_xlabel("k (micro-batches per update)")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
  memory.set_title("BERT-Small, seq 128, Adam: memory")
  speed.set_title("time per update")
  figure.tight_layout()
  figure.savefig(output, format="png")


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
  parser.add_argument("--output", default="memory_vs_k.png")
  parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.one:
    peak, seconds, trainable = measure(args.one[0], int(args.one[1]))
    print(json.dumps({"mode": args.one[0], "k": int(args.one[1]),
                      "peak_mb": peak, "seconds": seconds,
                      "trainable_mb": trainable}))
    return 0
  table = bench.Rows(
      f"{platform.machine()}, {os.cpu_count()} cores, TensorFlow "
      f"{tf.__version__}; BERT-Small seq 128, Adam, micro-batch "
      f"{MICRO_BATCH}", args.json, markdown=True,
      formats={"accumulate: peak MB": ".0f", "big batch: peak MB": ".0f",
               "accumulate: s per update": ".2f",
               "big batch: s per update": ".2f"})
  rows = []
  for k in args.ks:
    pair = {}
    for mode in ("accumulate", "big_batch"):
      result = subprocess.run([sys.executable, __file__, "--one", mode,
                               str(k)], capture_output=True, text=True,
                              check=True, env=dict(os.environ, **MALLOC_ENV))
      pair[mode] = json.loads(result.stdout.strip().splitlines()[-1])
      rows.append(pair[mode])
    table.add(**{"k": k,
                 "accumulate: peak MB": pair["accumulate"]["peak_mb"],
                 "big batch: peak MB": pair["big_batch"]["peak_mb"],
                 "accumulate: s per update": pair["accumulate"]["seconds"],
                 "big batch: s per update": pair["big_batch"]["seconds"]})
  base = next(r for r in rows if r["mode"] == "big_batch" and r["k"] == 1)
  top = max((r for r in rows if r["mode"] == "accumulate"),
            key=lambda r: r["k"])
  goal = base["peak_mb"] + base["trainable_mb"]
  print(f"accumulate at k={top['k']}: {top['peak_mb']:.0f} MB against the "
        f"goal k=1 + variables = {goal:.0f} MB (+10%: {1.1 * goal:.0f} MB)")
  plot(rows, args.output)
  print(f"wrote {args.output}")
  return table.exit_code()


if __name__ == "__main__":
  sys.exit(main())
