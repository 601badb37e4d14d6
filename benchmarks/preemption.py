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

Then the parameter-server cases (harness/ps_job.py: a chief, a worker and
a ps on loopback, SGD, k=2; SIGTERM to every task, or to the ps alone), in a
second table: the seconds to the last exit, the exit code, the chief's stop
step and the newest checkpoint, the windows of each training task in it
(each task's window moves its own row of a shared table), and the job started again to its end against the checkpoint's w minus
the windows of the second run.
"""

import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import (
  bench,  # noqa: E402
  ps_job,  # noqa: E402
)
from harness import preemption_cases as cases  # noqa: E402


def _exit(code):
  if code is None:
    return "still running"
  return f"killed by signal {-code}" if code < 0 else str(code)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--updates", type=int, default=150)
  parser.add_argument("--cases", nargs="+",
                      choices=cases.CASES + cases.PS_CASES,
                      default=list(cases.CASES + cases.PS_CASES))
  args = parser.parse_args()
  failed = _multiworker_cases(args, [c for c in args.cases
                                     if c in cases.CASES])
  failed |= _parameter_server_cases(args, [c for c in args.cases
                                           if c in cases.PS_CASES])
  return int(failed)


def _before_and_after():
  return (("before", cases.environment(ESTIMATOR_ACCUM_STOP_ON_SIGTERM="0")),
          ("after", None))


def _multiworker_cases(args, chosen):
  """The MultiWorkerMirroredStrategy and one-process rows; whether any
  failed."""
  if not chosen:
    return False
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
    for case in chosen:
      for when, env in _before_and_after():
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
  return bool(rows.exit_code())


def _parameter_server_cases(args, chosen):
  """The parameter-server rows; whether any failed."""
  if not chosen:
    return False
  rows = bench.Rows(
      "SIGTERM to a parameter-server job (chief, worker, ps on loopback); "
      "k=2, SGD, micro-batches of 0.1 s", args.json, markdown=True,
      formats={"s to exit": ".1f", "restarted: w - expected": "g"})
  with tempfile.TemporaryDirectory(prefix="preemption_ps_") as work:
    for case in chosen:
      for when, env in _before_and_after():
        model_dir = pathlib.Path(work, f"{case}_{when}")
        model_dir.mkdir()
        got = cases.run_ps_case(case, model_dir, model_dir, env=env,
                                step_seconds=0.1)
        w = float(cases.checkpoint_value(model_dir, "w"))
        windows = cases.ps_windows(cases.checkpoint_value(model_dir,
                                                          "table"))
        final = cases.resume_ps(model_dir)
        expected = w - sum(
            ps_job.PLAN[t][0] * (ps_job.PLAN[t][1] * cases.PS_REPEAT //
                                 ps_job.K) for t in cases.PS_TASKS)
        rows.add(**{
            "case": case, "": when, "s to exit": got["seconds"],
            "exit code": _exit(got["code"]),
            "chief's stop step": ", ".join(map(str, got["stop_steps"][:1]))
                                 or "-",
            "newest checkpoint": got["checkpoint_step"],
            "windows in it (chief, worker)": "{:g}, {:g}".format(
                *(windows[t] for t in cases.PS_TASKS)),
            "windows done (chief, worker)": "{}, {}".format(
                *(got["counts"][t] // ps_job.K for t in cases.PS_TASKS)),
            "restarted: w - expected": final["w"] - expected})
        if when == "after" and (got["code"] != cases.STOPPED or
                                final["w"] != expected):
          rows.fail(f"{case}: exit {got['code']}, w {final['w']} against "
                    f"{expected}")
  return bool(rows.exit_code())


if __name__ == "__main__":
  sys.exit(main())
