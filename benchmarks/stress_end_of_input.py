"""Runs a 2-worker job that ends with its input many times; counts failures.

Each run is `python -m tfconfig launch --workers 2 -- python
harness/multiworker_job.py --until_input_ends` (MultiWorkerMirroredStrategy,
train_and_evaluate, a finite sharded dataset, no max_steps, k=2, Adam),
in a new model_dir. Runs cycle through: no worker slowed, the chief's last
step slowed by 3 s, worker 1's last step slowed by 3 s (the bad timings of
the end-of-input race). Prints one line per failed run and a summary:

    python benchmarks/stress_end_of_input.py --runs 30
"""

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

TIMINGS = (None, 0, 1)


def run_once(timing, timeout):
  with tempfile.TemporaryDirectory() as model_dir:
    command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
               "--timeout", str(timeout), "--", sys.executable,
               os.path.join(ROOT, "harness", "multiworker_job.py"),
               "--model_dir", model_dir, "--optimizer", "adam", "--k", "2",
               "--updates", "3", "--until_input_ends"]
    if timing is not None:
      command += ["--slow_last_step", str(timing)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True,
                            text=True, check=False)
    saved = "saved final weights" in result.stdout
    return result.returncode, saved, result.stdout + result.stderr


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--runs", type=int, default=30)
  parser.add_argument("--timeout", type=float, default=300)
  args = parser.parse_args()
  failures = 0
  rows = bench.Rows("runs that failed (the rest ended with their final "
                    "weights saved)", args.json, markdown=True)
  started = time.monotonic()
  for run in range(args.runs):
    timing = TIMINGS[run % len(TIMINGS)]
    code, saved, output = run_once(timing, args.timeout)
    if code != 0 or not saved:
      failures += 1
      errors = [line for line in output.splitlines() if "Error" in line]
      rows.add(run=run + 1, slow=timing, **{
          "exit code": code,
          "last error": errors[-1] if errors else "no final weights"})
      rows.fail(f"run {run + 1}")
  print(f"{args.runs} runs, {failures} failed ({time.monotonic() - started:.0f}"
        " s; slowed worker cycling none/chief/worker 1)", flush=True)
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
