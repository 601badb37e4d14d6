"""The benchmarks' harness: arguments, step timing, result rows.

A benchmark script is its measurement and nothing else:

  from harness import bench

  def main():
    parser = bench.parser(__doc__)          # --json FILE, --repeats N
    parser.add_argument(...)                 # its own flags
    args = parser.parse_args()
    rows = bench.Rows("accumulation overhead", args.json)
    rows.add(variant=name, ms=...)           # one row per figure
    rows.print()                             # an aligned table
    return rows.exit_code()

`StepTimer` times an Estimator's session runs; peak memory is
`harness.memory`'s. Side by side in one run is the rule (these machines
are shared and noisy).
"""

import argparse
import json
import sys
import time

import tensorflow as tf

__all__ = ["Rows", "StepTimer", "parser"]



def parser(doc, repeats=5):
  """An ArgumentParser with the harness's flags: --json FILE (each result
  row appended as a JSON line) and --repeats N (timed repeats, default
  `repeats`); the description is the first line of `doc`."""
  made = argparse.ArgumentParser(
      description=(doc or "").strip().splitlines()[0] if doc else None)
  made.add_argument("--json", metavar="FILE", default=None,
                    help="append each result row to FILE as a JSON line")
  made.add_argument("--repeats", type=int, default=repeats,
                    help=f"timed repeats per figure (default {repeats})")
  return made


class StepTimer(tf.estimator.SessionRunHook):
  """Wall time of every session.run of an Estimator; `times` holds them,
  and with `path` they are written there as JSON at the end."""

  def __init__(self, path=None):
    self.times, self._path, self._start = [], path, None

  def before_run(self, run_context):
    self._start = time.perf_counter()

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter() - self._start)

  def end(self, session):
    if self._path:
      with open(self._path, "w") as writer:
        json.dump(self.times, writer)


class Rows:
  """A benchmark's result rows: printed as one aligned table, and appended
  as JSON lines to `json_path` when given."""

  def __init__(self, title, json_path=None):
    self.title, self.rows, self._json = title, [], json_path
    self.failed = []

  def add(self, **row):
    """Adds a row (its columns by keyword, in order); returns it."""
    self.rows.append(row)
    if self._json:
      with open(self._json, "a") as writer:
        writer.write(json.dumps(dict(row, benchmark=self.title)) + "\n")
    return row

  def fail(self, what):
    """Records a failed measurement: `exit_code` is then 1."""
    self.failed.append(what)
    print(f"FAILED: {what}", file=sys.stderr)

  def print(self, file=None):
    """Prints the rows as an aligned table under the title."""
    file = file or sys.stdout
    print(self.title, file=file)
    if not self.rows:
      return
    columns = list(dict.fromkeys(c for r in self.rows for c in r))
    cells = [[_cell(r.get(c, "")) for c in columns] for r in self.rows]
    widths = [max(len(c), *(len(row[i]) for row in cells))
              for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)), file=file)
    for row in cells:
      print("  ".join(v.rjust(w) for v, w in zip(row, widths)), file=file)

  def exit_code(self):
    return 1 if self.failed else 0


def _cell(value):
  if isinstance(value, float):
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
  return str(value)
