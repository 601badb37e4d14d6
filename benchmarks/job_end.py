"""How long a multi-worker job takes to end, run after run.

The README's two-worker job (`python -m tfconfig launch --workers 2 --
python -m models.mnist --strategy multi_worker --k 2 --nocompare`) on a
shared --model_dir, timed line by line: its end is the time from the last
micro-batch's progress line to the launcher's exit (the workers' last
saves, the chief's evaluation, every session closed). With `--trees`, the
same job from other checkouts of the project too (a `git worktree` of an
earlier commit: before and after a change), round by round, so that a
change of machine speed moves both alike. Printed per tree: the end's
median and maximum over the runs, the runs that failed, and how many left
a worker's `tmp_worker_*` directory (Estimator's non-chief saves) behind.

  python benchmarks/job_end.py [--runs 20] [--epochs 6]
      [--trees .,/tmp/before]
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

PROGRESS = re.compile(r"\] micro-batch \d+ \|")


def run(tree, epochs):
  """(training seconds, end seconds, leftovers, exit code) of one job."""
  model_dir = tempfile.mkdtemp(prefix="job_end_")
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
             "--timeout", "600", "--", sys.executable, "-m", "models.mnist",
             "--strategy", "multi_worker", "--k", "2", "--nocompare",
             "--epochs", str(epochs), "--model_dir", model_dir]
  started = time.perf_counter()
  first = last = None
  process = subprocess.Popen(
      command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, env=dict(os.environ, PYTHONPATH=tree))
  for line in process.stdout:
    if PROGRESS.search(line):
      last = time.perf_counter()
      first = first or last
  process.wait()
  ended = time.perf_counter()
  leftovers = [name for _, dirs, _ in os.walk(model_dir) for name in dirs
               if name.startswith("tmp_worker")]
  if last is None:
    return None, None, leftovers, process.returncode
  del started
  return last - first, ended - last, leftovers, process.returncode


def main(argv=None):
  parser = bench.parser(__doc__)
  parser.add_argument("--runs", type=int, default=20)
  parser.add_argument("--epochs", type=int, default=6)
  parser.add_argument("--trees", default=".",
                      help="comma-separated checkouts of the project")
  args = parser.parse_args(argv)
  trees = [os.path.abspath(os.path.join(ROOT, t)) for t in
           args.trees.split(",")]
  ends = {tree: [] for tree in trees}
  trained = {tree: [] for tree in trees}
  left = {tree: 0 for tree in trees}
  rows = bench.Rows(
      f"the end of the two-worker MNIST job ({args.epochs} epochs), "
      f"{args.runs} runs a tree, interleaved", args.json, markdown=True,
      formats={"median end s": ".1f", "max end s": ".1f",
               "median training s": ".1f"})
  for index in range(args.runs):
    for tree in trees:
      training, end, leftovers, code = run(tree, args.epochs)
      label = os.path.relpath(tree, ROOT)
      print(f"run {index + 1} {label}: training "
            f"{training if training is None else round(training, 1)} s, end "
            f"{end if end is None else round(end, 1)} s, exit {code}"
            + (f", left {leftovers}" if leftovers else ""), flush=True)
      if code != 0 or end is None:
        rows.fail(f"{label}: run {index + 1} exited {code}")
        continue
      left[tree] += bool(leftovers)
      ends[tree].append(end)
      trained[tree].append(training)
  for tree in trees:
    if ends[tree]:
      rows.add(tree=os.path.relpath(tree, ROOT), runs=len(ends[tree]),
               **{"median end s": statistics.median(ends[tree]),
                  "max end s": max(ends[tree]),
                  "median training s": statistics.median(trained[tree]),
                  "runs leaving tmp_worker_*": left[tree]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
