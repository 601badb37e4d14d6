"""Google's out-of-memory table for BERT, closed: the peak of each model
and length at micro-batch 1, plain, with accumulation and with
recomputation, and the plan that reaches the paper's batch of 32 exactly
under 12, 8 and 4 GB.

  python benchmarks/google_oom_table.py [--lengths 64 128 256 320 384 512]
      [--models base large] [--write docs/memory_planning.md]

Each (model, length) is measured at micro-batch 1 plain and at
micro-batches 1 and 2 with accumulation and with recomputation, each in a
process of its own (`benchmarks/bert_memory.py`: random weights, dropout
kept, AdamWeightDecay; tensor memory from the CPU's BFC allocator, which
holds tensors as a GPU does; GB are GiB). The plan for each budget is the
largest measured micro-batch that fits the budget less the planner's 10%
margin, without recomputation first: only measured points, no model (two
points this small do not resolve the activations per example from the
allocator's own variation, tens of MB). Measured points are kept in
--points, so that a run that stops goes on where it stopped.

Host accumulators are not measured here (on CPU host and device memory are
one): where recomputation at micro-batch 1 is still over the budget, the
table gives the arithmetic of moving the accumulators (4 bytes a
parameter) off the device.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bert_memory  # noqa: E402
from harness import bench  # noqa: E402

GIB = 2**30
# Google's README, "Out-of-memory issues": 12 GB Titan X, Adam, TF 1.11.
GOOGLE = {("base", 64): 64, ("base", 128): 32, ("base", 256): 16,
          ("base", 320): 14, ("base", 384): 12, ("base", 512): 6,
          ("large", 64): 12, ("large", 128): 6, ("large", 256): 2,
          ("large", 320): 1, ("large", 384): 0, ("large", 512): 0}
EFFECTIVE = 32
MARGIN = 0.1
START, END = "<!-- google-table:start -->", "<!-- google-table:end -->"


def load_points(path):
  points = {}
  if os.path.exists(path):
    with open(path) as reader:
      for line in reader:
        p = json.loads(line)
        points[p["model"], p["length"], p["mode"], p["micro_batch"]] = p
  return points


def _peak(points, model, length, mode, micro_batch):
  point = points.get((model, length, mode, micro_batch))
  return None if point is None else point["peak_bytes"]


def plan(points, model, length, budget_gb):
  """The plan for the paper's batch of 32 under `budget_gb` from the
  measured points alone: the largest measured micro-batch (2, then 1) of
  accumulation, then of accumulation with recomputation, whose peak fits
  the budget less the planner's margin; else the arithmetic of host
  accumulators (4 bytes a parameter off the device) on recomputation at 1."""
  limit = budget_gb * GIB * (1 - MARGIN)
  for mode, words in (("accumulate", ""), ("recompute", ", recompute")):
    for micro_batch in (2, 1):
      peak = _peak(points, model, length, mode, micro_batch)
      if peak is not None and peak <= limit:
        return f"{micro_batch} x k={EFFECTIVE // micro_batch}{words}"
  peak = _peak(points, model, length, "recompute", 1)
  if peak is None:
    return "none"
  parameters = points[model, length, "recompute", 1]["parameters"]
  device = peak - 4 * parameters
  if device <= limit:
    return (f"1 x k=32, recompute, host accumulators ({device / GIB:.1f} GB"
            " on the device, arithmetic)")
  return f"none ({peak / GIB:.1f} GB at 1 with recompute)"


def _gb(value):
  return "—" if value is None else f"{value / GIB:.2f}"


def table(points, models, lengths, budgets):
  budget_columns = " | ".join(f"{b} GB" for b in budgets)
  lines = [
      f"| model | tokens | Google's largest batch, 12 GB | plain at 1 | "
      f"accumulation at 1 | + recompute at 1 | + recompute at 2 | "
      f"{budget_columns} |",
      "| --- | --- | --- | --- | --- | --- | --- | " +
      " | ".join("---" for _ in budgets) + " |"]
  for model in models:
    for length in lengths:
      peaks = [_peak(points, model, length, mode, m) for mode, m in (
          ("plain", 1), ("accumulate", 1), ("recompute", 1),
          ("recompute", 2))]
      plans = " | ".join(plan(points, model, length, b) for b in budgets)
      lines.append(
          f"| BERT-{model.capitalize()} | {length} | "
          f"{GOOGLE.get((model, length), '')} | " +
          " | ".join(_gb(p) for p in peaks) + f" | {plans} |")
  return "\n".join(lines)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--models", nargs="+", default=["base", "large"],
                      choices=sorted(bert_memory.CONFIGS))
  parser.add_argument("--lengths", nargs="+", type=int,
                      default=[64, 128, 256, 320, 384, 512])
  parser.add_argument("--budgets", nargs="+", type=int, default=[12, 8, 4])
  parser.add_argument("--points", default="benchmarks/google_oom_points.jsonl")
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--write", default=None,
                      help="a Markdown file whose section between the "
                      "google-table markers is replaced by the table")
  args = parser.parse_args()
  points = load_points(args.points)
  # The points measured in this run (the rest are read from --points).
  rows = bench.Rows("measured now (BFC allocator on CPU, as a GPU holds "
                    "tensors)", args.json, markdown=True,
                    formats={"peak MB": ",.0f", "s per step": ".2f"})
  for model in args.models:
    for length in args.lengths:
      for mode in bert_memory.MODES:
        # The table reads plain training at micro-batch 1 only.
        for micro_batch in ((1,) if mode == "plain" else (1, 2)):
          key = (model, length, mode, micro_batch)
          if key in points:
            continue
          point = bert_memory.point(model, length, micro_batch, mode,
                                    args.steps)
          points[key] = point
          with open(args.points, "a") as writer:
            writer.write(json.dumps(point) + "\n")
          peak = point["peak_bytes"]
          rows.add(model=f"BERT-{model}", length=length,
                   **{"micro-batch": micro_batch, "mode": mode,
                      "peak MB": ("out of memory" if peak is None else
                                  peak / 2**20),
                      "s per step": point["step_seconds"] or 0.0})
  text = table(points, args.models, args.lengths, args.budgets)
  print(text)
  if args.write:
    with open(args.write) as reader:
      document = reader.read()
    if START not in document or END not in document:
      raise SystemExit(f"{args.write} has no {START} ... {END} section")
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    with open(args.write, "w") as writer:
      writer.write(f"{head}{START}\n{text}\n{END}{tail}")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
