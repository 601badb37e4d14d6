"""What accumulating itself costs, from the op times of traced steps.

`accumulation_overhead.py` times whole variants against each other; on this
shared machine their ratios move by a few percent from run to run, as much
as the 3% the goal allows. Here one accumulating graph (k=4) runs on one
thread, every micro-batch of three windows is traced
(`RunOptions.FULL_TRACE`), and each op's time is put in one of three parts:

  pass       the micro-batch's forward and backward pass: every op outside
             the train op's name scope, and its `gradients/`
  optimizer  the inner optimizer's update, at the window's end: the ops in
             the optimizer's own name scope (`Adam/...`) inside the
             window's branch (control flow v2's names)
  window     everything else the library adds: the adds into the
             accumulators and the counters on every micro-batch; at the
             window's end the mean, the global norm and the finite check,
             the zeroing, the counters, the cond

Printed per model and optimizer: each part in ms (medians over the traced
windows), and what the window's own ops cost per micro-batch against the
pass, ((k-1) x window ops of an accumulate step + window ops of the apply
step) / k / pass. The parts come from the same steps, so the machine's
drift does not enter the ratio. On one thread op times add up to the
step's time; the executor's per-op overhead (a few us an op) is not in
them.

  python benchmarks/window_ops.py [--models bert_small mlp]
      [--optimizers adam sgd] [--windows 3]
"""

import os
import re
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.accumulation_overhead import (  # noqa: E402
  MODELS,
  OPTIMIZERS,
  build,
)
from harness import bench  # noqa: E402

SCOPE = "gradient_accumulation/"


def part_of(node_name, optimizer_scope):
  """'pass', 'optimizer' or 'window' for a traced node's name."""
  if not node_name.startswith(SCOPE) or node_name.startswith(
      SCOPE + "gradients/"):
    return "pass"
  # The optimizer's ops run in the window's branch, whose function call
  # prefixes their names with `/_<n>/`; a node named after one of its slots
  # (`.../kernel/Adam/_28`, the branch's input switch) is not one of them.
  if re.search(rf"/_\d+/{re.escape(optimizer_scope)}/", node_name):
    return "optimizer"
  return "window"


def traced_parts(session, train_op, optimizer_scope):
  """Runs one micro-batch traced; returns {part: ms of op time}."""
  metadata = tf.compat.v1.RunMetadata()
  session.run(train_op, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
      run_metadata=metadata)
  parts = {"pass": 0.0, "optimizer": 0.0, "window": 0.0}
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      parts[part_of(node.node_name, optimizer_scope)] += (
          node.op_end_rel_micros - node.op_start_rel_micros) / 1e3
  return parts


def measure(model_name, optimizer_name, k, windows):
  """Returns the medians of each part on accumulate and on apply steps."""
  session, train_op, _, _ = build(model_name, "accum", k, optimizer_name,
                                  threads=1)
  optimizer_scope = OPTIMIZERS[optimizer_name]().get_name()
  for _ in range(k):  # warm-up window
    session.run(train_op)
  accumulate, apply = [], []
  for _ in range(windows):
    for position in range(k):
      parts = traced_parts(session, train_op, optimizer_scope)
      (apply if position == k - 1 else accumulate).append(parts)
  session.close()
  median = lambda steps, part: statistics.median(s[part] for s in steps)  # noqa: E731
  return {
      "pass": median(accumulate + apply, "pass"),
      "accumulate_window": median(accumulate, "window"),
      "apply_window": median(apply, "window"),
      "apply_optimizer": median(apply, "optimizer"),
      "accumulate_optimizer": median(accumulate, "optimizer"),
  }


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--models", nargs="+", default=["bert_small", "mlp"],
                      choices=list(MODELS))
  parser.add_argument("--optimizers", nargs="+", default=["adam", "sgd"],
                      choices=sorted(OPTIMIZERS))
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--windows", type=int, default=3)
  args = parser.parse_args()
  k = args.k
  rows = bench.Rows(
      f"{os.cpu_count()} cores, one thread; k={k}; op times of traced "
      f"micro-batches, medians over {args.windows} windows after one "
      "warm-up", args.json, markdown=True,
      formats={"ms pass": ".1f", "ms window ops, accumulate step": ".2f",
               "ms window ops, apply step": ".2f",
               "ms optimizer, apply step": ".1f",
               "window ops per micro-batch / pass": ".4f"})
  for model_name in args.models:
    for optimizer_name in args.optimizers:
      parts = measure(model_name, optimizer_name, k, args.windows)
      if parts["accumulate_optimizer"]:
        rows.fail(f"{model_name}, {optimizer_name}: the optimizer ran on an "
                  "accumulate step")
      own = ((k - 1) * parts["accumulate_window"] + parts["apply_window"]) / k
      rows.add(**{"model, optimizer": f"{model_name}, {optimizer_name}",
                  "ms pass": parts["pass"],
                  "ms window ops, accumulate step":
                      parts["accumulate_window"],
                  "ms window ops, apply step": parts["apply_window"],
                  "ms optimizer, apply step": parts["apply_optimizer"],
                  "window ops per micro-batch / pass":
                      1 + own / parts["pass"]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
