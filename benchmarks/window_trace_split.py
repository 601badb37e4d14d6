"""Where a traced window's time goes when no matrix product runs.

Reads the Chrome trace `python run_classifier.py --trace_window` writes
(`<output_dir>/window_trace.json`, estimator_accum.WindowTraceHook), lays
its ops on one time line and splits the time the ops were busy into the
time some matrix product ran (`MatMul` in the op's name) and the rest; each
instant of the rest is shared among the ops running then. Prints the
busy, product and idle milliseconds, then the ops that took most of the
time with no product running.

  python benchmarks/window_trace_split.py runs/<run>/window_trace.json [--top 12]
"""

import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import bench  # noqa: E402


def split(events):
  """(busy, product, idle, {op: time with no product running}) in the
  trace's microseconds, over its complete ("X") events."""
  events = [e for e in events if e.get("ph") == "X" and e.get("dur", 0) > 0]
  edges = sorted([(e["ts"], 1, i) for i, e in enumerate(events)] +
                 [(e["ts"] + e["dur"], -1, i) for i, e in enumerate(events)])
  running, last = set(), None
  busy = product = idle = 0.0
  others = collections.Counter()
  for at, change, index in edges:
    if last is not None and at > last:
      span = at - last
      if not running:
        idle += span
      else:
        busy += span
        if any("MatMul" in events[j]["name"] for j in running):
          product += span
        else:
          for j in running:
            others[events[j]["name"]] += span / len(running)
    last = at
    (running.add if change == 1 else running.discard)(index)
  return busy, product, idle, others


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("trace", help="a window_trace.json")
  parser.add_argument("--top", type=int, default=12)
  args = parser.parse_args()
  try:
    with open(args.trace) as file:
      trace = json.load(file)
  except (OSError, ValueError) as error:
    parser.error(f"trace {args.trace!r}: cannot be read as JSON ({error})")
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  busy, product, idle, others = split(events)
  rows = bench.Rows(f"{args.trace}: busy {busy / 1e3:.0f} ms, some product "
                    f"running {product / 1e3:.0f} ms, no product "
                    f"{(busy - product) / 1e3:.0f} ms, idle {idle / 1e3:.0f} "
                    "ms", args.json, markdown=True, formats={"ms": ".1f"})
  if not busy:
    rows.fail(f"trace {args.trace!r}: no op events")
  for op, time in others.most_common(args.top):
    rows.add(op=op, ms=time / 1e3)
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
