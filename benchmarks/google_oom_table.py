"""Google's out-of-memory table for BERT, closed: the largest micro-batch
that fits 12, 8 and 4 GB, plain, with accumulation and with recomputation,
and the planner's plan for the paper's batch of 32 in each cell.

  python benchmarks/google_oom_table.py [--lengths 64 128 256 320 384 512]
      [--models base large] [--write docs/memory_planning.md]

Each (model, length, mode) is measured at micro-batches 1 and 2, each in a
process of its own (`benchmarks/bert_memory.py`: random weights, dropout
kept, AdamWeightDecay; tensor memory from the CPU's BFC allocator, which
holds tensors as a GPU does). Peak and time are modelled as linear in the
micro-batch from those two points, as the planner models them, and the
planner's own choice (`estimator_accum/planning/search.py`) is made from
them for an effective batch of 32 (micro-batches that divide 32, the
planner's 10% margin). Measured points are kept in --points, so that a
run that stops goes on where it stopped.

Host accumulators are not measured here (on CPU host and device memory are
one): where recomputation at micro-batch 1 is still over the budget, the
table gives the arithmetic of moving the accumulators (4 bytes a
parameter) off the device.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bert_memory  # noqa: E402
from estimator_accum.planning import search  # noqa: E402

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


class _Point:
  """A bert_memory point as the planner's Fit reads a Measurement."""

  def __init__(self, p):
    self.micro_batch = p["micro_batch"]
    self.peak_bytes = p["peak_bytes"]
    self.step_seconds = p["step_seconds"]
    self.adding_peak_bytes = p.get("micro_batch_peak_bytes")
    self.window_end_peak_bytes = p.get("window_end_peak_bytes")


def fit(points, model, length, mode):
  measured = [_Point(points[model, length, mode, m]) for m in (1, 2)]
  return search.Fit.of(mode, [m for m in measured
                              if m.peak_bytes is not None])


def largest(fit, budget):
  if fit.bytes_per_example <= 0:
    return 0
  return max(int((budget - fit.static_bytes) // fit.bytes_per_example), 0)


def cell(points, model, length, budget_gb):
  """One row of the table for one budget."""
  budget = budget_gb * GIB
  fits = {mode: fit(points, model, length, mode)
          for mode in bert_memory.MODES}
  row = {mode: largest(fits[mode], budget) for mode in bert_memory.MODES}
  divisors = [m for m in range(1, EFFECTIVE + 1) if EFFECTIVE % m == 0]
  picked = search.best([fits["accumulate"], fits["recompute"]], divisors,
                       budget * (1 - MARGIN), set())
  plain_32 = fits["plain"].examples_per_second(EFFECTIVE)
  row["plan"] = row["speed"] = None
  row["host"] = ""
  if picked is not None:
    mode, micro_batch, _ = picked
    row["plan"] = (f"{micro_batch} x k={EFFECTIVE // micro_batch}"
                   f"{', recompute' if mode == 'recompute' else ''}")
    row["speed"] = fits[mode].examples_per_second(micro_batch) / plain_32
  else:
    accumulators = points[model, length, "recompute", 1]["parameters"] * 4
    needs = fits["recompute"].peak(1) - accumulators
    row["host"] = (f"host accumulators: {needs / GIB:.1f} GB at 1 "
                   f"({'fits' if needs <= budget * (1 - MARGIN) else 'over'})")
  return row


def table(points, models, lengths, budgets):
  lines = [
      "| model | tokens | budget | Google, plain | plain | accumulation | "
      "+ recompute | plan for 32 | its examples/s vs plain at 32 |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for model in models:
    for length in lengths:
      for budget in budgets:
        row = cell(points, model, length, budget)
        google = GOOGLE.get((model, length), "") if budget == 12 else ""
        plan = row["plan"] or row["host"] or "none"
        speed = "" if row["speed"] is None else f"{row['speed']:.2f}x"
        lines.append(
            f"| BERT-{model.capitalize()} | {length} | {budget} GB | {google} "
            f"| {row['plain']} | {row['accumulate']} | {row['recompute']} | "
            f"{plan} | {speed} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
  for model in args.models:
    for length in args.lengths:
      for mode in bert_memory.MODES:
        for micro_batch in (1, 2):
          key = (model, length, mode, micro_batch)
          if key in points:
            continue
          point = bert_memory.point(model, length, micro_batch, mode,
                                    args.steps)
          points[key] = point
          with open(args.points, "a") as writer:
            writer.write(json.dumps(point) + "\n")
          peak = point["peak_bytes"]
          print(f"measured BERT-{model} {length} x {micro_batch} {mode}: "
                f"{'out of memory' if peak is None else f'{peak / 2**20:,.0f} MB'}"
                f", {point['step_seconds'] or 0:.2f} s", flush=True)
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


if __name__ == "__main__":
  main()
