"""The scripts' micro-batch flags: an effective batch, and the micro-batch
per replica chosen by hand or measured (`--micro_batch_size auto`: the
largest that fits; `fastest`: of those that fit, the split whose windows
train fastest, timed).

The plan is printed and written to the run directory as
micro_batch_plan.json. A run that resumes in that directory keeps the plan
it started with (a resumed run must split its windows the same way), and
under a cluster only the chief measures: the other workers wait for its
plan in the shared directory.
"""

import os
import time

import tensorflow as tf
from absl import logging

import estimator_accum
from estimator_accum.planning import planner

PLAN_FILE = "micro_batch_plan.json"
WAIT_SECONDS = 1800
# --micro_batch_size values that measure: the largest that fits, or the
# fastest split that fits.
MEASURED = ("auto", "fastest")


class PlanError(ValueError):
  """Bad plan flags, or no plan: one line."""


def define_flags(flags):
  """Defines --effective_batch_size, --micro_batch_size, --memory_budget_mb
  and --memory_margin on `flags` (absl.flags)."""
  flags.DEFINE_integer(
      "effective_batch_size", None, "Examples per update over all replicas "
      "(with --micro_batch_size; default the script's micro-batch x k x "
      "replicas).", lower_bound=1)
  flags.DEFINE_string(
      "micro_batch_size", None, "Micro-batch per replica: a number; "
      "'auto' to measure the largest that fits --memory_budget_mb; or "
      "'fastest' to time whole windows of the splits that fit (the "
      "largest down) and take the fastest. k is then the effective batch "
      "/ (replicas x micro-batch); every split trains the same update.")
  flags.DEFINE_float(
      "memory_budget_mb", None, "With --micro_batch_size auto or fastest: "
      "the memory "
      "one replica's device may use, in MB (default: the GPU's free memory; "
      "required on CPU).")
  flags.DEFINE_float(
      "memory_margin", planner.DEFAULT_MARGIN, "With --micro_batch_size "
      "auto or fastest: the share of the budget kept free.", lower_bound=0,
      upper_bound=0.99)


def use_bfc_on_cpu(values):
  """With --micro_batch_size auto or fastest, TensorFlow's CPU tensors go
  through the BFC allocator a GPU uses, whose peak the planner reads. Call
  before TensorFlow's first session."""
  if values.micro_batch_size in MEASURED:
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def check_flags(values, explicit):
  """PlanError for plan flags that contradict each other. `explicit`: the
  names of the script's hand-set micro-batch and k flags given."""
  if values.micro_batch_size is None:
    for name in ("effective_batch_size", "memory_budget_mb"):
      if getattr(values, name) is not None:
        raise PlanError(f"--{name}={getattr(values, name):g} needs "
                        "--micro_batch_size (auto or a number).")
    return
  if explicit:
    raise PlanError(
        f"--micro_batch_size={values.micro_batch_size} and "
        f"{', '.join('--' + name for name in explicit)} both set the "
        "micro-batch: give --effective_batch_size with --micro_batch_size, "
        "or the micro-batch and k by hand.")
  if values.micro_batch_size not in MEASURED:
    if not values.micro_batch_size.isdigit() or (
        int(values.micro_batch_size) < 1):
      raise PlanError(f"--micro_batch_size={values.micro_batch_size}: must "
                      "be 'auto', 'fastest' or a positive whole number.")
  elif values.memory_budget_mb is not None and values.memory_budget_mb <= 0:
    raise PlanError(f"--memory_budget_mb={values.memory_budget_mb:g}: must "
                    "be a positive number of MB.")


def resolve(values, *, build, effective_batch, replicas, run_dir, is_chief,
            speed_build=None):
  """The plan for this run, printed: the one already in `run_dir` (a
  resumed or restarted run splits its windows as it did), else the flags'
  (measured with `build` for 'auto' and 'fastest'; 'fastest' times
  `speed_build`, the step on the input as the run arranges it, default
  `build`), which the chief writes there."""
  path = os.path.join(run_dir, PLAN_FILE)
  if tf.io.gfile.exists(path):
    return _kept(values, load(path), path, effective_batch)
  try:
    if values.micro_batch_size not in MEASURED:
      plan = estimator_accum.MicroBatchPlan.given(
          effective_batch, int(values.micro_batch_size), replicas)
    elif not is_chief:
      return _kept(values, _wait_for(path), path, effective_batch)
    else:
      plan = _measured(values, build, effective_batch, replicas,
                       speed_build)
  except (ValueError, TypeError) as error:
    raise PlanError(str(error).replace(
        "memory_budget_mb=", "--memory_budget_mb=").replace(
            "micro_batch=", "--micro_batch_size=")) from None
  print(plan.describe() if plan.measurements else plan.summary(), flush=True)
  if is_chief:
    write(plan, path)
  return plan


def _measured(values, build, effective_batch, replicas, speed_build):
  """plan_micro_batch, without the INFO lines of the steps it measures; a
  script's --recompute, when given, fixes recomputation on."""
  budget = ("the GPU's free memory" if values.memory_budget_mb is None
            else f"{values.memory_budget_mb:g} MB")
  fastest = values.micro_batch_size == "fastest"
  print(f"measuring the largest micro-batch whose peak fits {budget} "
        f"(effective batch {effective_batch}, {replicas} replica(s))"
        + ("; then timing whole windows of the splits that fit, from it "
           "down" if fastest else ""), flush=True)
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.WARNING)
  try:
    return estimator_accum.plan_micro_batch(
        build, effective_batch, memory_budget_mb=values.memory_budget_mb,
        margin=values.memory_margin, replicas=replicas,
        recompute=True if getattr(values, "recompute", False) else "auto",
        log=lambda line: print(f"measured {line}", flush=True),
        objective="fastest" if fastest else "largest",
        speed_build=speed_build if fastest else None)
  finally:
    logging.set_verbosity(verbosity)


def _kept(values, plan, path, effective_batch):
  """`plan`, read from `path`, if this run's flags agree with it."""
  asked = values.micro_batch_size
  if plan.effective_batch != effective_batch or (
      asked not in MEASURED and int(asked) != plan.micro_batch):
    raise PlanError(
        f"{path} holds a run of {plan.summary()}: resume it with the same "
        "batch flags, or give another output directory.")
  print(f"plan from {path} (delete it to measure again): {plan.summary()}",
        flush=True)
  return plan


def write(plan, path):
  """Writes `plan` to `path` atomically (workers may be waiting for it)."""
  plan.write(path)


def load(path):
  return planner.MicroBatchPlan.read(path)


def _wait_for(path):
  deadline = time.monotonic() + WAIT_SECONDS
  while not tf.io.gfile.exists(path):
    if time.monotonic() > deadline:
      raise PlanError(f"no plan at {path} after {WAIT_SECONDS} s: the chief "
                      "measures it (is the directory shared?)")
    time.sleep(0.5)
  plan = load(path)
  print(f"using the chief's plan: {plan.summary()}", flush=True)
  return plan


def save_every(plan, micro_batches):
  """Micro-batches between checkpoints: `micro_batches` rounded up to whole
  windows of the plan as first made, so every checkpoint is at a window
  boundary (where a halved plan can go on exactly), in this plan's
  micro-batches."""
  first_k = plan.k >> plan.halvings
  return -(-micro_batches // first_k) * first_k << plan.halvings

