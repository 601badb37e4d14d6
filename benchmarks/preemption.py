"""SIGTERM to a training job, before and after the stop on SIGTERM
(estimator_accum/distribution/preemption.py; "before" is the same code
with ESTIMATOR_ACCUM_STOP_ON_SIGTERM=0, as every earlier release behaved).

  python benchmarks/preemption.py [--updates 150] [--cases all_tasks ...]

For each case of harness/preemption_cases.py (SIGTERM to every task, to
one task, during the window's all-reduce with a peer frozen, a second
SIGTERM during the stop's save in one process without a strategy, one
process of MirroredStrategy's two replicas), on 2 MultiWorkerMirroredStrategy
workers on loopback through `tfconfig launch` (25 s grace) or one process: the seconds from the signal to the last exit,
the exit code, the step every task agreed on, the newest complete
checkpoint's step, and the job started again against the uninterrupted
job (largest absolute weight difference). k=2, Adam, micro-batches slowed
to 0.1 s so that a job takes about 30 s.
"""

import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import bench  # noqa: E402
from harness import preemption_cases as cases  # noqa: E402


def _exit(code):
  if code is None:
    return "still running"
  return f"killed by signal {-code}" if code < 0 else str(code)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--updates", type=int, default=150)
  parser.add_argument("--cases", nargs="+", choices=cases.CASES,
                      default=list(cases.CASES))
  args = parser.parse_args()
  rows = bench.Rows(
      "SIGTERM to a job (2 workers on loopback, or one process); k=2, Adam, "
      f"{2 * args.updates} micro-batches of 0.1 s per worker", args.json,
      markdown=True, formats={"s to exit": ".1f",
                              "restarted vs uninterrupted": ".1e"})
  with tempfile.TemporaryDirectory(prefix="preemption_") as work:
    reference = {}
    for strategy in cases.STRATEGIES:
      model_dir = pathlib.Path(work, f"reference_{strategy}")
      cases.run_to_end(model_dir, args.updates, strategy)
      reference[strategy] = cases.final_weights(model_dir)
    for case in args.cases:
      for when, env in (("before", cases.environment(
          ESTIMATOR_ACCUM_STOP_ON_SIGTERM="0")), ("after", None)):
        model_dir = pathlib.Path(work, f"{case}_{when}")
        model_dir.mkdir()
        got = cases.run_case(case, model_dir, model_dir, args.updates,
                             env=env, step_seconds=0.1)
        went_on_from, weights = cases.resume(model_dir, args.updates,
                                             got["strategy"])
        difference = cases.largest_difference(weights,
                                              reference[got["strategy"]])
        rows.add(**{
            "case": case, "": when, "s to exit": got["seconds"],
            "exit code": _exit(got["code"]),
            "agreed stop step": ", ".join(map(str, got["stop_steps"])) or
                                "-",
            "newest checkpoint": got["checkpoint_step"],
            "restarted from": went_on_from,
            "restarted vs uninterrupted": difference})
        if when == "after" and (got["code"] != cases.STOPPED or
                                difference > 1e-6):
          rows.fail(f"{case}: exit {got['code']}, difference {difference}")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
