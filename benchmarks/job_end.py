"""How long a multi-worker job takes to end, run after run.

`--job mnist` (the default): the README's two-worker job (`python -m
tfconfig launch --workers 2 -- python -m models.mnist --strategy
multi_worker --k 2 --nocompare`) on a shared --model_dir; its end is the
time from the last micro-batch's progress line to the launcher's exit (the
workers' last saves, the chief's evaluation, every session closed).
`--job run_classifier`: `run_classifier.py --distribution_strategy
multi_worker` on two workers with its evaluation and export (`--epochs`
of its built-in data); its end is from worker 0's (the chief's) "trained N
micro-batches" line to the launcher's exit (the last saves, the chief's
evaluation and export, every session closed). Either way "close" is the
time from the job's last line to the launcher's exit: what no line
explains. The interpreter running this script runs the job (TensorFlow
2.15's venv: Estimator; 2.21's: the library's runner). With `--trees`, the
same job from other checkouts of the project too (a `git worktree` of an
earlier commit: before and after a change), round by round, so that a
change of machine speed moves both alike. Printed per tree: the end's and
the close's median and maximum over the runs, the runs that failed, and
how many left a worker's `tmp_worker_*` directory (non-chief saves) behind.

  python benchmarks/job_end.py [--runs 20] [--job mnist] [--epochs 6]
      [--trees .,/tmp/before]
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

PROGRESS = re.compile(r"\] micro-batch \d+ \|")


def _command(job, epochs, model_dir):
  if job == "mnist":
    return ["-m", "models.mnist", "--strategy", "multi_worker", "--k", "2",
            "--nocompare", "--epochs", str(epochs), "--model_dir",
            model_dir], "--workers", "2"
  return ["run_classifier.py", "--distribution_strategy", "multi_worker",
          "--num_train_epochs", str(epochs), "--output_dir", model_dir,
          "--export_dir", os.path.join(model_dir, "export")], "--workers", "2"


def _training_ended(job, line):
  if job == "mnist":
    return bool(PROGRESS.search(line))
  return "trained " in line and " micro-batches" in line and (
      line.startswith("[worker:0]"))


def run(tree, job, epochs):
  """(training seconds, end seconds, close seconds, leftovers, exit code)
  of one job."""
  model_dir = tempfile.mkdtemp(prefix="job_end_")
  task, *shape = _command(job, epochs, model_dir)
  command = [sys.executable, "-m", "tfconfig", "launch", *shape,
             "--timeout", "900", "--", sys.executable, *task]
  first = last = said = None
  process = subprocess.Popen(
      command, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, env=dict(os.environ, PYTHONPATH=tree))
  for line in process.stdout:
    said = time.perf_counter()
    first = first or said
    if _training_ended(job, line):
      last = said
  process.wait()
  ended = time.perf_counter()
  leftovers = [name for _, dirs, _ in os.walk(model_dir) for name in dirs
               if name.startswith("tmp_worker")]
  # A run_classifier run leaves ~800 MB (checkpoints, features): 40 runs
  # filled this machine's disk before the runs were removed.
  shutil.rmtree(model_dir, ignore_errors=True)
  if last is None:
    return None, None, None, leftovers, process.returncode
  return last - first, ended - last, ended - said, leftovers, (
      process.returncode)


def main(argv=None):
  parser = bench.parser(__doc__)
  parser.add_argument("--runs", type=int, default=20)
  parser.add_argument("--job", choices=("mnist", "run_classifier"),
                      default="mnist")
  parser.add_argument("--epochs", type=float, default=None,
                      help="the job's epochs (default: mnist 6, "
                      "run_classifier 0.05)")
  parser.add_argument("--trees", default=".",
                      help="comma-separated checkouts of the project")
  args = parser.parse_args(argv)
  epochs = args.epochs if args.epochs is not None else (
      6 if args.job == "mnist" else 0.05)
  if args.job == "mnist":
    epochs = int(epochs)
  trees = [os.path.abspath(os.path.join(ROOT, t)) for t in
           args.trees.split(",")]
  ends = {tree: [] for tree in trees}
  closes = {tree: [] for tree in trees}
  trained = {tree: [] for tree in trees}
  left = {tree: 0 for tree in trees}
  rows = bench.Rows(
      f"the end of the two-task {args.job} job ({epochs} epochs), "
      f"{args.runs} runs a tree, interleaved", args.json, markdown=True,
      formats={"median end s": ".1f", "max end s": ".1f",
               "median close s": ".1f", "max close s": ".1f",
               "median training s": ".1f"})
  for index in range(args.runs):
    for tree in trees:
      training, end, close, leftovers, code = run(tree, args.job, epochs)
      label = os.path.relpath(tree, ROOT)
      print(f"run {index + 1} {label}: training "
            f"{training if training is None else round(training, 1)} s, end "
            f"{end if end is None else round(end, 1)} s, close "
            f"{close if close is None else round(close, 1)} s, exit {code}"
            + (f", left {leftovers}" if leftovers else ""), flush=True)
      if code != 0 or end is None:
        rows.fail(f"{label}: run {index + 1} exited {code}")
        continue
      left[tree] += bool(leftovers)
      ends[tree].append(end)
      closes[tree].append(close)
      trained[tree].append(training)
  for tree in trees:
    if ends[tree]:
      rows.add(tree=os.path.relpath(tree, ROOT), runs=len(ends[tree]),
               **{"median end s": statistics.median(ends[tree]),
                  "max end s": max(ends[tree]),
                  "median close s": statistics.median(closes[tree]),
                  "max close s": max(closes[tree]),
                  "median training s": statistics.median(trained[tree]),
                  "runs leaving tmp_worker_*": left[tree]})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
