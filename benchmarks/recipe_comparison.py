"""The public Estimator recipe against build_accumulating_train_op under
MultiWorkerMirroredStrategy, 2 local worker processes (tfconfig launch).

For each: the largest weight error against plain one-device training with
the big batch 2*k*B (relative to each tensor's largest weight), the
micro-batch steps per window whose gradients cross workers, the bytes through
collectives (all-reduce, all-gather) per window, and the median time per window (steps traced with FULL_TRACE, so
both pay the tracing).

  python benchmarks/recipe_comparison.py            # k=4, micro-batch 16
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import recipe_model  # noqa: E402
from harness import bench  # noqa: E402

WORKERS = 2


def run_variant(variant, args, root):
  model_dir = os.path.join(root, variant)
  os.makedirs(model_dir)
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers",
             str(WORKERS), "--timeout", "900", "--", sys.executable,
             "benchmarks/recipe_worker.py", "--model_dir", model_dir,
             "--variant", variant, "--k", str(args.k), "--micro_batch",
             str(args.micro_batch), "--updates", str(args.updates)]
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    sys.exit(f"{variant} failed:\n{result.stdout[-3000:]}")
  steps = json.load(open(os.path.join(model_dir, "collectives_0.json")))
  saved = np.load(os.path.join(model_dir, "weights.npz"))
  weights = {n: saved[n.replace("/", "__")] for n in recipe_model.WEIGHTS}
  windows = [steps[i:i + args.k] for i in range(0, len(steps), args.k)]
  gradient_steps = [sum(1 for _, size, _ in w if size > 1024)
                    for w in windows]
  return {
      "weights": weights,
      "rounds": statistics.mean(gradient_steps),
      "megabytes": statistics.mean(sum(size for _, size, _ in w)
                                   for w in windows) / 2 ** 20,
      # The first window includes graph warm-up; leave it out.
      "seconds": statistics.median(sum(s for _, _, s in w)
                                   for w in windows[1:]),
  }


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=16)
  parser.add_argument("--updates", type=int, default=6)
  args = parser.parse_args()
  data = recipe_model.make_data(WORKERS * args.k * args.micro_batch *
                                args.updates)
  expected = recipe_model.reference_weights(
      data, WORKERS * args.k * args.micro_batch, args.updates)
  error, rounds, megabytes = (
      "weight error vs big batch",
      "micro-batches per window whose gradients cross workers",
      "MB through collectives per window")
  rows = bench.Rows(
      f"{platform.machine()}, {os.cpu_count()} cores; {WORKERS} workers "
      f"(MultiWorkerMirroredStrategy, control flow v1), k={args.k}, "
      f"micro-batch {args.micro_batch}, {args.updates} windows; model: "
      f"embedding {recipe_model.VOCAB}x{recipe_model.EMBED} + dense, "
      "Momentum", args.json, markdown=True,
      formats={error: ".1e", rounds: ".2f", megabytes: ".1f",
               "ms per window": ".0f"})
  with tempfile.TemporaryDirectory() as root:
    for variant in ("recipe", "library"):
      got = run_variant(variant, args, root)
      rows.add(**{"variant": variant,
                  error: recipe_model.relative_error(got["weights"],
                                                     expected),
                  rounds: got["rounds"], megabytes: got["megabytes"],
                  "ms per window": 1000 * got["seconds"]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
