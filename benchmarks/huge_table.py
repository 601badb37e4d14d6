"""A 1,000,000 x 64 embedding table (244 MB): accumulator memory against the
rows a window touches, compact (`sparse_accumulation=True`) against the dense
path (a copy of the table and a row mask).

For each number of ids per micro-batch (uniform over the table, k=4, SGD,
a small dense head), in a fresh process per variant:
- the accumulator state after the window's first k-1 micro-batches, read from
  the variables themselves (exact bytes);
- the peak resident memory while training whole windows (Linux VmHWM,
  reset after initialization and one warm-up window), above the resident
  memory before;
- the time per micro-batch (median over rounds of whole windows).

  python benchmarks/huge_table.py [--ids 256 4096 65536]

The peak includes the micro-batch's own temporaries (gathered rows, their
gradient) and, for compact, the merge's (old and new rows concatenated, then
summed), which are freed after each micro-batch.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import bench  # noqa: E402
from harness.memory import MALLOC_ENV, PeakMemory  # noqa: E402

ROWS, DIM, K = 1_000_000, 64, 4
VARIANTS = ("compact", "dense")


def measure(variant, ids_per_micro_batch, rounds):
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable(
        "table", [ROWS, DIM], use_resource=True,
        initializer=tf.compat.v1.random_normal_initializer(stddev=0.1))
    head = tf.compat.v1.get_variable("head", [DIM, 1], use_resource=True)
    ids = tf.random.uniform([ids_per_micro_batch], 0, ROWS, tf.int64, seed=1)
    loss = tf.reduce_mean(tf.square(
        tf.matmul(tf.gather(table, ids), head) - 1.0))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), K,
        sparse_accumulation=variant == "compact", summaries=False)
    state = estimator_accum.get_accumulation_state()
    (accumulator,) = [a for a in state.accumulators if a.variable is table]
    # Sizes from the graph: fetching a 244 MB variable would copy it.
    state_bytes = tf.add_n([
        tf.cast(tf.size(v.read_value()), tf.int64) * v.dtype.base_dtype.size
        for v in accumulator.state_variables()])
    rows_touched = (tf.size(accumulator.indices.read_value())
                    if accumulator.is_compact else
                    tf.math.count_nonzero(accumulator.rows.read_value()))
    session = tf.compat.v1.Session(config=estimator_accum.own_threads(
        tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                 inter_op_parallelism_threads=1)))
    session.run(tf.compat.v1.global_variables_initializer())
    for _ in range(K):  # warm-up window
      session.run(train_op)
    times = []
    with PeakMemory() as peak:
      for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(K):
          session.run(train_op)
        times.append((time.perf_counter() - start) / K)
    for _ in range(K - 1):
      session.run(train_op)
    state_bytes, rows_touched = session.run([state_bytes, rows_touched])
    return {"state_mb": int(state_bytes) / 2**20, "rows": int(rows_touched),
            "peak_mb": peak.mb,
            "ms": 1000 * statistics.median(times)}


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--ids", type=int, nargs="+", default=[256, 4096, 65536])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(measure(args.one[0], int(args.one[1]), args.rounds)))
    return 0
  rows = bench.Rows(
      f"{platform.machine()}, {os.cpu_count()} cores; table {ROWS:,} x "
      f"{DIM} ({ROWS * DIM * 4 / 2**20:.0f} MB float32), k={K}, SGD, one "
      "thread; state after k-1 micro-batches", args.json, markdown=True,
      formats={"accumulator MB": ".1f", "bytes per row": ",.0f",
               "peak MB above resident": ".0f", "ms per micro-batch": ".1f",
               "ids per micro-batch": ",", "rows in the window": ","})
  for count in args.ids:
    for variant in VARIANTS:
      result = subprocess.run(
          [sys.executable, __file__, "--one", variant, str(count),
           "--rounds", str(args.rounds)],
          capture_output=True, text=True, check=True,
          env=dict(os.environ, **MALLOC_ENV))
      figures = json.loads(result.stdout.strip().splitlines()[-1])
      rows.add(**{
          "ids per micro-batch": count, "variant": variant,
          "rows in the window": figures["rows"],
          "accumulator MB": figures["state_mb"],
          "bytes per row": (figures["state_mb"] * 2**20 /
                            max(figures["rows"], 1)),
          "peak MB above resident": figures["peak_mb"],
          "ms per micro-batch": figures["ms"]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
