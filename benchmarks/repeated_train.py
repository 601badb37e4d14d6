"""Process memory across repeated Estimator.train() calls (BERT-Small).

Estimator builds a new graph for every train() call, and train_and_evaluate
calls it once per evaluation round. This trains BERT-Small on random tokens
with accumulation, --calls times, k micro-batches per call (resuming from
the checkpoint each time), and prints the resident memory after each call:
if anything kept the old graphs reachable, it grows by a graph per call.

  python benchmarks/repeated_train.py
  python benchmarks/repeated_train.py --plain      # the same without accumulation
"""

import gc
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.accumulation_overhead import MODELS  # noqa: E402
from harness import bench  # noqa: E402
from harness.memory import MALLOC_ENV, status_mb  # noqa: E402


def main():
  if any(os.environ.get(key) != value for key, value in MALLOC_ENV.items()):
    # glibc reads its mmap threshold at start: restart with it fixed, so a
    # freed tensor goes back to the system and the figures repeat.
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, **MALLOC_ENV))
  parser = bench.parser(__doc__)
  parser.add_argument("--model", default="bert_small", choices=sorted(MODELS))
  parser.add_argument("--calls", type=int, default=6)
  parser.add_argument("--k", type=int, default=2)
  parser.add_argument("--plain", action="store_true",
                      help="train with optimizer.minimize, k steps per call")
  args = parser.parse_args()

  def model_fn(features, labels, mode):
    del features, labels
    loss = MODELS[args.model]()
    optimizer = tf.compat.v1.train.AdamOptimizer(1e-4)
    if args.plain:
      train_op = optimizer.minimize(
          loss, tf.compat.v1.train.get_or_create_global_step())
    else:
      train_op = estimator_accum.build_accumulating_train_op(
          loss, optimizer, args.k)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn():
    # The models read constant inputs; the dataset only drives the steps.
    return tf.data.Dataset.from_tensors(({"unused": 0}, 0)).repeat()

  with tempfile.TemporaryDirectory() as model_dir:
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=0,
                                    log_step_count_steps=1_000_000)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    what = "plain training" if args.plain else "accumulation"
    rows = bench.Rows(f"{args.model}, Adam, {what}, {args.k} micro-batches "
                      "per train() call", args.json, markdown=True,
                      formats={"resident MB": ".0f",
                               "MB since the first call": "+.0f"})
    first = None
    for call in range(1, args.calls + 1):
      estimator.train(input_fn, max_steps=args.k * call)
      gc.collect()
      resident = status_mb("VmRSS")
      first = resident if first is None else first
      rows.add(**{"train() calls": call, "resident MB": resident,
                  "MB since the first call": resident - first})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
