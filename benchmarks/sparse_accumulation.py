"""Sparse gradients: scatter-add accumulation (the library) against
densifying every micro-batch (the public recipe's assign_add), for an
embedding-heavy model: a 100,000 x 128 table (48.8 MB), 32 examples of 64
ids per micro-batch, a small dense head, k=4, Momentum.

Times are medians over interleaved rounds, per micro-batch, window apply
included. Memory: in a process per variant, the peak resident memory while
training (Linux: the high-water mark is reset after initialization and one
warm-up window), minus the resident memory before training.

  python benchmarks/sparse_accumulation.py
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.public_recipe import recipe_train_op  # noqa: E402
from harness import bench  # noqa: E402
from harness.memory import MALLOC_ENV, PeakMemory  # noqa: E402

VOCAB, DIM, BATCH, IDS, K = 100_000, 128, 32, 64, 4
VARIANTS = ("forward_backward", "library", "densify")


def build(variant):
  graph = tf.Graph()
  with graph.as_default():
    rng = np.random.RandomState(0)
    ids = tf.random.uniform([BATCH, IDS], 0, VOCAB, tf.int32, seed=1)
    labels = tf.constant(rng.randint(0, 2, BATCH).astype(np.int32))
    table = tf.compat.v1.get_variable(
        "embedding", [VOCAB, DIM],
        initializer=tf.compat.v1.random_normal_initializer(stddev=0.1))
    pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
    logits = tf.compat.v1.layers.dense(pooled, 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    if variant == "forward_backward":
      gradients = tf.compat.v1.gradients(loss, [table])
      train_op = tf.reduce_sum(gradients[0].values[0])
    elif variant == "library":
      train_op = estimator_accum.build_accumulating_train_op(
          loss, optimizer, K, summaries=False)
    else:
      train_op = recipe_train_op(loss, optimizer, K)
    session = tf.compat.v1.Session(graph=graph)
    session.run(tf.compat.v1.global_variables_initializer())
  return session, train_op


def seconds_per_micro_batch(session, train_op, count):
  start = time.perf_counter()
  for _ in range(count):
    session.run(train_op)
  return (time.perf_counter() - start) / count


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--peak-rss-of", choices=VARIANTS,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.peak_rss_of:
    session, train_op = build(args.peak_rss_of)
    seconds_per_micro_batch(session, train_op, K)
    with PeakMemory() as peak:
      seconds_per_micro_batch(session, train_op, 4 * K)
    print(peak.mb)
    return 0
  built = {variant: build(variant) for variant in VARIANTS}
  for session, train_op in built.values():
    seconds_per_micro_batch(session, train_op, K)
  times = {variant: [] for variant in VARIANTS}
  for _ in range(args.rounds):
    for variant, (session, train_op) in built.items():
      times[variant].append(seconds_per_micro_batch(session, train_op, 5 * K))
  peaks = {}
  for variant in VARIANTS:
    result = subprocess.run([sys.executable, __file__, "--peak-rss-of",
                             variant], capture_output=True, text=True,
                            check=True, env=dict(os.environ, **MALLOC_ENV))
    peaks[variant] = float(result.stdout.strip().splitlines()[-1])
  peak = "peak MB while training, above the resident memory before"
  rows = bench.Rows(
      f"{platform.machine()}, {os.cpu_count()} cores; embedding "
      f"{VOCAB}x{DIM} ({VOCAB * DIM * 4 / 2**20:.1f} MB), micro-batch "
      f"{BATCH} x {IDS} ids, k={K}, Momentum", args.json, markdown=True,
      formats={"ms per micro-batch": ".2f", "/ forward+backward": ".2f",
               peak: ".0f"})
  base = statistics.median(times["forward_backward"])
  for variant in VARIANTS:
    median = statistics.median(times[variant])
    rows.add(**{"variant": variant, "ms per micro-batch": 1000 * median,
                "/ forward+backward": median / base, peak: peaks[variant]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
