"""The benchmarks' harness: arguments, step timing, result rows.

A benchmark script is its measurement and nothing else:

  from harness import bench

  def main():
    parser = bench.parser(__doc__)          # --json FILE
    parser.add_argument(...)                 # its own flags
    args = parser.parse_args()
    rows = bench.Rows("accumulation overhead", args.json, markdown=True,
                      formats={"ms": ".1f"})
    rows.add(variant=name, ms=...)           # one row per figure, printed
    return rows.exit_code()                  # 1 after any rows.fail(...)

Every script builds its command line with `parser` and prints its figures
through `Rows` (tests/unit/test_design.py checks both). `StepTimer` times
an Estimator's session runs; peak memory is `harness.memory`'s; clusters
are started by `harness.hosts` and `harness.multiworker_job`. Side by side
in one run is the rule (these machines are shared and noisy).
"""

import argparse
import json
import re
import sys

__all__ = ["Rows", "parser"]  # and StepTimer, below


def __getattr__(name):
  # StepTimer is an Estimator hook: TensorFlow is imported when a script
  # asks for it, not by every script that only prints rows (code_shape.py
  # reads source and imports nothing of TensorFlow).
  if name == "StepTimer":
    from harness.step_timer import StepTimer  # noqa: PLC0415
    return StepTimer
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



# run_classifier.py's own lines, as the benchmarks that run it read them:
# its training's end, and its progress lines (each line's rate is over the
# micro-batches since the line before).
TRAINED = re.compile(
    r"trained (\d+) micro-batches(?: \([^)]*\))? in ([\d.]+) s")
_PROGRESS = re.compile(
    r"micro-batch (\d+)/\d+ .*\| ([\d.]+) micro-batches/sec")


def progress_rates(log):
  """[(micro-batch, micro-batches a second since the line before)] of
  run_classifier.py's progress lines in `log` (its stderr)."""
  return [(int(step), float(rate)) for step, rate in _PROGRESS.findall(log)]


def parser(doc, repeats=None):
  """An ArgumentParser with the harness's flags: --json FILE (each result
  row appended as a JSON line) and, for a script that repeats its timings,
  --repeats N (default `repeats`); the description is the first line of
  `doc`."""
  made = argparse.ArgumentParser(
      description=(doc or "").strip().splitlines()[0] if doc else None)
  made.add_argument("--json", metavar="FILE", default=None,
                    help="append each result row to FILE as a JSON line")
  if repeats is not None:
    made.add_argument("--repeats", type=int, default=repeats,
                      help=f"timed repeats per figure (default {repeats})")
  return made


class Rows:
  """A benchmark's result rows, appended as JSON lines to `json_path` when
  given, and printed: as one aligned table at `print()`, or with `markdown`
  as a Markdown table streamed row by row as they are added (the header
  from the first row's columns), the form docs/ quote. `formats` maps a
  column to its format spec (".1f"); other numbers get three decimals
  below 100, one above."""

  def __init__(self, title, json_path=None, markdown=False, formats=None,
               file=None):
    self.title, self.rows, self._json = title, [], json_path
    self._markdown, self._formats = markdown, dict(formats or {})
    self._file = file
    self.failed = []
    if markdown:
      print(title, file=self._out(), flush=True)

  def _out(self):
    return self._file or sys.stdout

  def add(self, **row):
    """Adds a row (its columns by keyword, in order); returns it."""
    self.rows.append(row)
    if self._json:
      with open(self._json, "a") as writer:
        writer.write(json.dumps(dict(row, benchmark=self.title),
                                default=str) + "\n")
    if self._markdown:
      if len(self.rows) == 1:
        print("| " + " | ".join(row) + " |", file=self._out())
        print("|" + " --- |" * len(row), file=self._out())
      columns = list(self.rows[0])
      print("| " + " | ".join(self.cell(c, row.get(c, ""))
                              for c in columns) + " |",
            file=self._out(), flush=True)
    return row

  def fail(self, what):
    """Records a failed measurement: `exit_code` is then 1."""
    self.failed.append(what)
    print(f"FAILED: {what}", file=sys.stderr)

  def print(self):
    """Prints the rows as an aligned table under the title (a Markdown
    table was printed as its rows came)."""
    if self._markdown:
      return
    file = self._out()
    print(self.title, file=file)
    if not self.rows:
      return
    columns = list(dict.fromkeys(c for r in self.rows for c in r))
    cells = [[self.cell(c, r.get(c, "")) for c in columns] for r in self.rows]
    widths = [max(len(c), *(len(row[i]) for row in cells))
              for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)), file=file)
    for row in cells:
      print("  ".join(v.rjust(w) for v, w in zip(row, widths)), file=file)

  def cell(self, column, value):
    """`value` as printed in `column`."""
    if column in self._formats and isinstance(value, (int, float)):
      return format(value, self._formats[column])
    if isinstance(value, float):
      return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
      return f"{value:,}" if abs(value) >= 10000 else str(value)
    return str(value)

  def exit_code(self):
    return 1 if self.failed else 0
