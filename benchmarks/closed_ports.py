"""What closing a job's ports costs: the same two-worker job, open and
closed, interleaved round by round.

The job is MultiWorkerMirroredStrategy's two workers of a plain graph
(tests/jobs/graph_multiworker_job.py: Adam, k=2, micro-batch 4; every
window all-reduces across the two processes over loopback), run by
`python -m tfconfig launch --isolation MODE` for each mode in turn, round
after round, so that a change of machine speed moves every mode alike.
Printed per mode: the median over rounds of the workers' training
seconds (from the first micro-batch to the last, timed inside each task)
and of the whole launch, and each as a ratio to `open`; and whether every
mode ended at the same weights.

  python benchmarks/closed_ports.py [--rounds 5] [--windows 300]
      [--modes open,auto,namespace]

`auto` is the firewall as root (an nftables table on every packet to the
job's ports), else a private network namespace.
"""

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402


def run(mode, windows):
  env = dict(os.environ, JOB_STEPS=str(windows), TF_CPP_MIN_LOG_LEVEL="3")
  started = time.perf_counter()
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--isolation", mode, "--timeout", "900", "--", sys.executable,
       os.path.join(ROOT, "tests", "jobs", "graph_multiworker_job.py"),
       "adam"], cwd=ROOT, env=env, capture_output=True, text=True)
  whole = time.perf_counter() - started
  if result.returncode != 0:
    raise SystemExit(f"closed_ports: the {mode} job failed (exit "
                     f"{result.returncode}): {result.stderr[-1500:]}")
  trained = [float(line.split()[-1]) for line in result.stdout.splitlines()
             if "TRAINED_SECONDS" in line]
  weights = [line.split("WEIGHTS ", 1)[1]
             for line in result.stdout.splitlines() if "WEIGHTS " in line]
  return max(trained), whole, weights[0]


def main(argv=None):
  parser = bench.parser(__doc__)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--windows", type=int, default=300)
  parser.add_argument("--modes", default="open,auto,namespace")
  args = parser.parse_args(argv)
  modes = args.modes.split(",")
  if "open" not in modes:
    raise SystemExit("closed_ports: --modes needs 'open', the reference")
  times = {mode: ([], []) for mode in modes}
  weights = {}
  for round_ in range(args.rounds):
    for mode in modes:
      trained, whole, weight = run(mode, args.windows)
      times[mode][0].append(trained)
      times[mode][1].append(whole)
      weights.setdefault(mode, weight)
      print(f"round {round_ + 1} {mode:>9}: training {trained:6.2f} s, "
            f"whole {whole:6.2f} s", flush=True)
  rows = bench.Rows(
      f"{args.windows} windows of 2 x 4 on 2 workers, median of "
      f"{args.rounds} interleaved rounds", args.json, markdown=True,
      formats={"training s": ".2f", "whole s": ".2f", "training / open":
               ".3f", "whole / open": ".3f"})
  base_train = statistics.median(times["open"][0])
  base_whole = statistics.median(times["open"][1])
  for mode in modes:
    train, whole = (statistics.median(t) for t in times[mode])
    same = json.loads(weights[mode]) == json.loads(weights["open"])
    rows.add(isolation=mode, **{"training s": train, "whole s": whole,
                                "training / open": train / base_train,
                                "whole / open": whole / base_whole,
                                "same weights": same})
    if not same:
      rows.fail(f"{mode}: the weights differ from the open job's")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
