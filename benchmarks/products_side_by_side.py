"""The main job's matrix products in TensorFlow and in PyTorch, side by side.

One layer's six weight products of MiniLM (hidden 384, intermediate 1536)
forward, each one's input gradient and kernel gradient, at a micro-batch's
token rows: TensorFlow's rate is `peer_speed.layer_products_rate` (the
main job's oneDNN path, the independent products side by side on the
inter-op threads); PyTorch's the same products one after another on its
threads (eager, as Trainer runs them), in the peer venv
(`requirements-peer.txt`, made on first use as by peer_speed.py). The two
take turns, round by round. Prints each side's GFLOP/s at each height and
TensorFlow's median over PyTorch's.

  python benchmarks/products_side_by_side.py [--rows 217,868] [--rounds 2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import bench  # noqa: E402

HIDDEN, INTERMEDIATE = 384, 1536
REPEATS = 50


def _shapes():
  return [(HIDDEN, HIDDEN)] * 4 + [(HIDDEN, INTERMEDIATE),
                                   (INTERMEDIATE, HIDDEN)]


def torch_rate(rows):
  """PyTorch's float32 GFLOP/s on the same products (run in the peer venv)."""
  import torch  # noqa: PLC0415

  triples = [(torch.randn(rows, a), torch.randn(a, b), torch.randn(rows, b))
             for a, b in _shapes()]

  def products():
    for x, w, dy in triples:
      x @ w, dy @ w.t(), x.t() @ dy

  flops = 3 * 2 * rows * sum(a * b for a, b in _shapes())
  with torch.no_grad():
    products()
    started = time.perf_counter()
    for _ in range(REPEATS):
      products()
    return flops * REPEATS / (time.perf_counter() - started) / 1e9


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--rows", default="217,868",
                      help="comma-separated token rows (217: micro-batch 8 "
                           "of the main job, unpadded)")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--torch_rows", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.torch_rows:  # The peer venv's side: one JSON number.
    print(json.dumps(torch_rate(args.torch_rows)))
    return 0
  try:
    rows = [int(r) for r in args.rows.split(",")]
  except ValueError:
    parser.error(f"--rows must be comma-separated integers, got {args.rows!r}")
  if any(r < 1 for r in rows) or args.rounds < 1:
    parser.error(f"--rows and --rounds must be positive, got {args.rows!r}, "
                 f"{args.rounds}")

  import peer_speed  # noqa: PLC0415  (sets TensorFlow's CPU path first)
  import tensorflow as tf  # noqa: PLC0415

  python = peer_speed.peer_python(None)
  table = bench.Rows(
      f"one layer's products and their gradients, {peer_speed.cpu_name()}, "
      f"{args.rounds} interleaved round(s)", args.json, markdown=True,
      formats={"TensorFlow / PyTorch (medians)": ".2f"})
  rates = {(side, r): [] for side in ("tf", "torch") for r in rows}
  for _ in range(args.rounds):
    for r in rows:
      rates["tf", r].append(peer_speed.layer_products_rate(
          r, HIDDEN, INTERMEDIATE))
      peer = subprocess.run(
          [python, os.path.abspath(__file__), "--torch_rows", str(r)],
          capture_output=True, text=True, check=False)
      if peer.returncode != 0:
        table.fail(f"PyTorch's side at {r} rows (exit {peer.returncode}): "
                   f"{peer.stderr.strip().splitlines()[-1:]}")
        return table.exit_code()
      rates["torch", r].append(json.loads(peer.stdout.split()[-1]))
  for r in rows:
    ours, theirs = rates["tf", r], rates["torch", r]
    table.add(**{
        "token rows": r,
        f"TensorFlow {tf.__version__} GFLOP/s": " ".join(
            f"{x:.0f}" for x in ours),
        "PyTorch GFLOP/s": " ".join(f"{x:.0f}" for x in theirs),
        "TensorFlow / PyTorch (medians)":
            statistics.median(ours) / statistics.median(theirs)})
  return table.exit_code()


if __name__ == "__main__":
  sys.exit(main())
