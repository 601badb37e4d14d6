"""The scripts' micro-batch flags: an effective batch, and the micro-batch
per replica chosen by hand or measured (`--micro_batch_size auto`: the
largest that fits; `fastest`: of those that fit, the split whose windows
train fastest, timed).

The plan is printed and written to the run directory as
micro_batch_plan.json. A run that resumes in that directory keeps the plan
it started with (a resumed run must split its windows the same way), and
under a cluster only the chief measures: the other workers wait for its
plan in the shared directory.

A 'fastest' plan (its timing costs about 10 s a split on the main job) is
also kept in the plan cache, under a key of everything it was measured
from: a run in a new directory with the same model, step flags, training
data, budget, TensorFlow and device reads it instead of timing again
(--noplan_cache measures).
"""

import hashlib
import json
import os
import time

import tensorflow as tf
from absl import logging

import estimator_accum
from estimator_accum import _files as estimator_accum_files
from estimator_accum.planning import planner

PLAN_FILE = "micro_batch_plan.json"
WAIT_SECONDS = 1800
# --micro_batch_size values that measure: the largest that fits, or the
# fastest split that fits.
MEASURED = ("auto", "fastest")
# The plan cache's directory (default plans/ in the pretrained models'
# cache directory; empty: no cache).
CACHE_ENV = "ESTIMATOR_ACCUM_PLAN_CACHE"
CACHE_FORMAT = 1


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
  flags.DEFINE_bool(
      "plan_cache", True, "With --micro_batch_size fastest: read the plan "
      "from the plan cache ($ESTIMATOR_ACCUM_PLAN_CACHE, default plans/ in "
      "the cache directory) when the same model, step flags, training data, "
      "budget, TensorFlow and device were timed before, and keep a new plan "
      "there. --noplan_cache: time again.")


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
            speed_build=None, signature=None):
  """The plan for this run, printed: the one already in `run_dir` (a
  resumed or restarted run splits its windows as it did), else the flags'
  (measured with `build` for 'auto' and 'fastest'; 'fastest' times
  `speed_build`, the step on the input as the run arranges it, default
  `build`), which the chief writes there. `signature`: a JSON-able dict
  of what the script's step is built from (the model, the flags that
  shape the step, the training data); with it, a 'fastest' plan goes
  through the plan cache."""
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
      cache = _cache_entry(values, effective_batch, replicas, signature)
      plan = _cached(cache, effective_batch)
      if plan is not None:
        print(f"plan from the plan cache {cache[0]} (timed before for this "
              "model, step flags, training data, budget, TensorFlow and "
              f"device; --noplan_cache times again): {plan.summary()}",
              flush=True)
        write(plan, path)
        return plan
      plan = _measured(values, build, effective_batch, replicas,
                       speed_build)
      _keep(cache, plan)
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


def cache_dir():
  """$ESTIMATOR_ACCUM_PLAN_CACHE (empty: no cache), else plans/ in the
  cache directory ($ESTIMATOR_ACCUM_CACHE, else ~/.cache/estimator_accum)."""
  if CACHE_ENV in os.environ:
    return os.environ[CACHE_ENV] or None
  from models.bert import pretrained  # noqa: PLC0415

  return os.path.join(pretrained.default_cache_dir(), "plans")


def device_identity():
  """What the plan's figures depend on of this machine: the CPU's model
  and cores, the GPUs TensorFlow sees, and the environment that picks
  TensorFlow's CPU kernels and allocator."""
  cpu = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as info:
      cpu = next((line.split(":", 1)[1].strip() for line in info
                  if line.startswith("model name")), cpu)
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(
      os, "sched_getaffinity") else os.cpu_count()
  gpus = [tf.config.experimental.get_device_details(gpu).get(
      "device_name", gpu.name)
          for gpu in tf.config.list_physical_devices("GPU")]
  environment = {name: os.environ.get(name) for name in (
      "TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "TF_CPU_ALLOCATOR_USE_BFC",
      "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
  return {"cpu": cpu, "cores": cores, "gpus": gpus,
          "environment": environment}


def cache_key(values, effective_batch, replicas, signature):
  """(16 hex digits, the parts they hash): the plan cache's key of a
  'fastest' plan."""
  parts = {
      "format": CACHE_FORMAT, "signature": signature,
      "effective_batch": effective_batch, "replicas": replicas,
      "memory_budget_mb": values.memory_budget_mb,
      "memory_margin": values.memory_margin,
      "micro_batch_size": values.micro_batch_size,
      "tensorflow": tf.__version__, "device": device_identity()}
  text = json.dumps(parts, sort_keys=True, default=str)
  # The parts as the cache file holds them (JSON's lists and strings).
  return hashlib.sha256(text.encode()).hexdigest()[:16], json.loads(text)


def _cache_entry(values, effective_batch, replicas, signature):
  """(path, key parts) of this run's plan in the plan cache, or None (not
  'fastest', no signature, --noplan_cache, or no cache directory)."""
  if (values.micro_batch_size != "fastest" or signature is None or
      not getattr(values, "plan_cache", False)):
    return None
  directory = cache_dir()
  if not directory:
    return None
  key, parts = cache_key(values, effective_batch, replicas, signature)
  return os.path.join(directory, f"{key}.json"), parts


def _cached(cache, effective_batch):
  """The plan at the cache entry, or None (none there, or unreadable:
  said in a line, and measured again)."""
  if cache is None or not tf.io.gfile.exists(cache[0]):
    return None
  try:
    with tf.io.gfile.GFile(cache[0]) as reader:
      entry = json.load(reader)
    plan = planner.MicroBatchPlan.from_dict(entry["plan"])
  except (ValueError, KeyError, TypeError, tf.errors.OpError) as error:
    print(f"plan cache {cache[0]} cannot be read ({type(error).__name__}: "
          f"{str(error)[:120]}): timing again", flush=True)
    return None
  if entry.get("key") != cache[1] or plan.effective_batch != effective_batch:
    print(f"plan cache {cache[0]} was measured for something else: timing "
          "again", flush=True)
    return None
  return plan


def _keep(cache, plan):
  """Writes `plan` to the cache entry, atomically; a cache that cannot be
  written (a full disk, no permission) is said in a line, not fatal."""
  if cache is None:
    return
  try:
    tf.io.gfile.makedirs(os.path.dirname(cache[0]))
    estimator_accum_files.write_whole(cache[0], json.dumps(
        {"key": cache[1], "plan": plan.to_dict()}, indent=1, default=str))
  except (OSError, tf.errors.OpError) as error:
    print(f"plan cache {cache[0]} not written ({str(error)[:160]}); the run "
          "goes on", flush=True)


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

