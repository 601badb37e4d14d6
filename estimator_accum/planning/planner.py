"""Choose the micro-batch and k from measured memory.

Accumulation here is exact, so how an effective batch is split into
micro-batch x k does not change what is trained: only memory and speed
depend on it. `plan_micro_batch` builds the accumulating training step at a
few candidate micro-batches, each in a fresh graph, runs a few micro-batches
of real input, and reads the allocator's peak of tensor memory
(`tf.config.experimental.get_memory_info`: on a GPU its BFC allocator; on
CPU TensorFlow's CPU allocator, the BFC one when TF_CPU_ALLOCATOR_USE_BFC=true,
as a GPU would hold the tensors). It returns the largest micro-batch whose
peak fits the budget less a margin.

    plan = estimator_accum.plan_micro_batch(
        estimator_accum.estimator_step(model_fn, input_fn),
        effective_batch=32, memory_budget_mb=4000)
    print(plan.describe())
    # train with plan.micro_batch per replica and plan.k

Candidates are measured from the largest down; the first that fits is the
plan, so the peaks of every larger one are printed with it.
"""

import dataclasses
import functools
import inspect
import math
import time

from estimator_accum.planning import search, speed
from estimator_accum.planning.inputs import (  # noqa: F401
  estimator_step,
  window_batches,
)
from estimator_accum.planning.measure import (  # noqa: F401  (the planner's names)
  check_build,
  check_memory_statistics,
  default_device,
  free_device_memory,
  measure_peak,
  own_threads,
)
from estimator_accum.planning.plan import (  # noqa: F401  (the planner's names)
  EQUAL,
  WEIGHTED,
  Measurement,
  MicroBatchPlan,
  labelled,
  megabytes,
  memory_options_name,
  replica_share,
)

DEFAULT_MARGIN = 0.1
# Micro-batches run per candidate: two windows of k=2, so the measured peak
# holds the accumulating step and the step that applies the window.
_MEASURED_K = 2


def candidate_micro_batches(share, uneven=False):
  """The micro-batches worth measuring for `share` examples per replica,
  ascending: its divisors; with `uneven`, the smallest micro-batch for each
  k (ceil(share / k)), whose windows end with a shorter micro-batch."""
  if uneven:
    return sorted({math.ceil(share / k) for k in range(1, share + 1)})
  return [m for m in range(1, share + 1) if share % m == 0]


def _budget(memory_budget_mb, device):
  if memory_budget_mb is not None:
    if (isinstance(memory_budget_mb, bool) or
        not isinstance(memory_budget_mb, (int, float)) or
        not math.isfinite(memory_budget_mb) or memory_budget_mb <= 0):
      raise ValueError(f"memory_budget_mb={memory_budget_mb!r}: must be a "
                       "positive number of MB (2**20 bytes)")
    return int(memory_budget_mb * 2**20)
  if device.upper().startswith("GPU"):
    return free_device_memory(device)
  raise ValueError(
      f"memory_budget_mb=None on {device}: give the budget in MB; only a "
      "GPU's free memory can be read as a default")


def _check_margin(margin):
  if (isinstance(margin, bool) or not isinstance(margin, (int, float)) or
      not 0 <= margin < 1):
    raise ValueError(f"margin={margin!r}: must be a fraction in [0, 1)")
  return float(margin)


def plan_micro_batch(build=None, effective_batch=None, *,
                     memory_budget_mb=None, margin=DEFAULT_MARGIN, replicas=1,
                     uneven=False, device=None, log=None, model_fn=None,
                     input_fn=None, params=None, recompute="auto",
                     accumulator_placement="auto", session_config=None,
                     objective="largest", speed_build=None,
                     speed_windows=speed.DEFAULT_WINDOWS):
  """Measures candidate micro-batches and returns the largest that fits, or
  with several memory options, the fastest plan that fits; with
  objective="fastest", the split whose whole windows train fastest.

  Args:
    build: `build(micro_batch, k)`, called with a fresh default graph: builds
      the input of `micro_batch` examples (real input; for inputs whose size
      varies, such as sequences cut to the longest in the batch, give it the
      longest) and the accumulating train op with that k, and returns the
      train op. `estimator_step(model_fn, input_fn)` makes one from an
      Estimator's functions. Measuring uses k=2 whatever the plan's k: the
      accumulators and the apply step are the same for every k.
    effective_batch: examples per update, over all replicas.
    memory_budget_mb: the memory one replica's device may use, in MB
      (2**20 bytes). Default: the GPU's free memory; required on CPU.
    margin: the share of the budget kept free (fragmentation, collectives'
      buffers): a candidate fits if its peak is <= budget x (1 - margin).
    replicas: data-parallel replicas, workers x devices per worker; each
      trains effective_batch / replicas examples per update.
    uneven: also allow micro-batches that do not divide the replica's share
      (the last micro-batch of each window is shorter). Only exact when the
      train op weights micro-batches by `num_examples` and the input yields
      windows as `window_batches` does.
    device: 'GPU:0', 'CPU:0', ...; default the first GPU, else the CPU.
    log: callable given a line per measured candidate (e.g. print).
    session_config: the job's tf.compat.v1.ConfigProto (its threads
      decide which tensors are alive at once), measured on threads of its
      own (`own_threads`: give the job `own_threads(config)` too).
    model_fn, input_fn, params: instead of `build`, an Estimator's (as
      `estimator_step(model_fn, input_fn, params)`).
    recompute: True, False, or "auto": weigh recomputing activations
      (`estimator_accum.recompute`) when `build` takes a `recompute`
      keyword (estimator_step's passes it as params["recompute"]).
    accumulator_placement: "device", "host", or "auto": weigh host
      accumulators on a GPU, one replica, when `build` takes an
      `accumulator_placement` keyword (not on CPU: one memory).
    objective: "largest" (the largest micro-batch that fits; with several
      memory options, the fastest modelled plan that fits: _memory_plan)
      or "fastest": from that one down, whole windows of each split that
      fits are timed at its own k, and the shortest wins (speed.py).
    speed_build: the `build` to time, on the input the job trains on
      (default `build`, which memory is measured with).
    speed_windows: windows timed per split after one untimed.

  Returns a MicroBatchPlan; ValueError (one line) when even micro-batch 1
  does not fit, and for bad arguments."""
  build = _build_from(build, model_fn, input_fn, params)
  speed_windows = speed.check_arguments(objective, speed_build, speed_windows)
  started = time.perf_counter()
  plan = _unmeasured_plan(effective_batch, replicas, margin, device,
                          memory_budget_mb)
  candidates = candidate_micro_batches(plan.micro_batch, uneven)
  choices = _option_choices(build, recompute, accumulator_placement,
                            plan.device, replicas)
  measure_one = functools.partial(measure_peak, session_config=session_config)
  plan = _memory_plan(build, plan, candidates, choices, log, started,
                      memory_budget_mb, measure_one,
                      largest_first=objective == "fastest")
  if objective == "largest":
    return plan
  return _fastest_plan(speed_build or build, plan, candidates, log, started,
                       session_config, speed_windows)


def _fastest_plan(build, plan, candidates, log, started, session_config,
                  windows):
  """`plan` (what fits, by memory) replaced by the split of its memory
  options whose timed windows are the shortest."""
  options = _build_options(build, plan.recompute, plan.accumulator_placement)

  def time_one(micro_batch):
    began = time.perf_counter()
    k = math.ceil(plan.per_replica / micro_batch)
    seconds, peak = speed.time_windows(
        build, micro_batch, k, plan.device, windows,
        session_config=session_config, **options)
    return Measurement(micro_batch, k, peak, time.perf_counter() - began,
                       None if seconds is None else seconds / k,
                       plan.recompute, plan.accumulator_placement,
                       window_seconds=seconds)

  timed, best, reason = speed.fastest(plan, candidates, time_one, log)
  measurements = speed.merged(plan.measurements, timed)
  if best is None:
    # Not even the split that fit when measured for memory fit its timed
    # run: keep it, as objective="largest" would.
    return dataclasses.replace(
        plan, measurements=measurements,
        planning_seconds=time.perf_counter() - started,
        reason="no split timed fits; the largest that fits by memory")
  return _split(plan, best.micro_batch, measurements=measurements,
                planning_seconds=time.perf_counter() - started,
                reason=reason)


def _unmeasured_plan(effective_batch, replicas, margin, device,
                     memory_budget_mb):
  """The plan's arguments checked, as the plan of one micro-batch of the
  replica's whole share (k=1), which measuring replaces."""
  share = replica_share(effective_batch, replicas)
  margin = _check_margin(margin)
  device = device or default_device()
  budget = _budget(memory_budget_mb, device)
  check_memory_statistics(device)
  return MicroBatchPlan(effective_batch, replicas, share, 1, share, EQUAL,
                        budget, margin, device)


def _memory_plan(build, plan, candidates, choices, log, started,
                 memory_budget_mb, measure_one, largest_first):
  """What fits by memory, for the memory option `choices`.

  With several choices, each is measured at two small micro-batches, its
  peak and time modelled as linear in the micro-batch: the plan is the
  fastest modelled point that fits (a memory-saving option only where
  nothing saving less fits, or 10% faster), measured (search.py).
  `largest_first` (objective="fastest", which times the splits from the
  largest that fits down): with several choices, the largest candidate
  with the choice saving least is measured first, and when it fits that
  is the plan: nothing saves time over it, and one build is measured
  instead of the model's three. When it does not fit, the model starts
  from it (one build more)."""
  if len(choices) == 1:
    return _largest_down_plan(build, plan, candidates, choices[0], log,
                              started, memory_budget_mb, measure_one)
  measured = {}
  if largest_first:
    largest = _measured(build, plan, choices[0], candidates[-1], measure_one,
                        log)
    if plan.fits(largest.peak_bytes):
      return _split(plan, largest.micro_batch, measurements=(largest,),
                    planning_seconds=time.perf_counter() - started,
                    recompute=choices[0][0],
                    accumulator_placement=choices[0][1],
                    reason="the largest fits without saving memory")
    measured[choices[0], candidates[-1]] = largest
  return _modelled_plan(build, plan, candidates, choices, log, started,
                        memory_budget_mb, measure_one, measured)


def _largest_down_plan(build, plan, candidates, choice, log, started,
                       memory_budget_mb, measure_one):
  """`plan_micro_batch` for one (recompute, accumulator_placement) `choice`:
  the largest candidate that fits, measured from the largest down."""
  measured = {}

  def fits(index):
    micro_batch = candidates[index]
    measured[micro_batch] = _measured(build, plan, choice, micro_batch,
                                      measure_one, log)
    return plan.fits(measured[micro_batch].peak_bytes)

  best = _largest_fitting(len(candidates), fits)
  elapsed = time.perf_counter() - started
  measurements = tuple(measured[m] for m in sorted(measured, reverse=True))
  if best is None:
    smallest = measured[candidates[0]]
    raise _over_budget(plan, memory_budget_mb, smallest.micro_batch, {
        "plain": "more" if smallest.peak_bytes is None else
                 megabytes(smallest.peak_bytes)}, free_shown=True)
  return _split(plan, candidates[best], measurements=measurements,
                planning_seconds=elapsed, recompute=choice[0],
                accumulator_placement=choice[1])


def _measured(build, plan, choice, micro_batch, measure_one, log):
  """The `Measurement` of `micro_batch` with the memory options `choice`:
  measured at min(k, 2) micro-batches (a window's adds and its end), the
  plan's k recorded, logged."""
  k = math.ceil(plan.per_replica / micro_batch)
  measurement = dataclasses.replace(measure_one(
      build, micro_batch, min(k, _MEASURED_K), plan.device,
      **_build_options(build, *choice)), k=k)
  if log:
    log(_measured_line(measurement))
  return measurement


def _over_budget(plan, memory_budget_mb, micro_batch, needs,
                 free_shown=False):
  """The ValueError of a budget no candidate fits: the smallest
  `micro_batch`'s needs by memory options ({"plain": "1.2 MB", ...})."""
  given = (f"memory_budget_mb={memory_budget_mb:g}"
           if memory_budget_mb is not None
           else f"the free memory of {plan.device}" + (
               f" ({megabytes(plan.budget_bytes)})" if free_shown else ""))
  others = "".join(f"; with {options} it needs {value}"
                   for options, value in needs.items() if options != "plain")
  return ValueError(
      f"{given}: even micro-batch {micro_batch} needs "
      f"{needs.get('plain', 'more')}, over {megabytes(plan.limit_bytes)} "
      f"(the budget less the {plan.margin:.0%} margin){others}")


def _split(plan, micro_batch, **fields):
  """`plan` with `micro_batch` and the k, last micro-batch and exactness
  it implies, and `fields`."""
  share = plan.per_replica
  k = math.ceil(share / micro_batch)
  last = share - (k - 1) * micro_batch
  return dataclasses.replace(
      plan, micro_batch=micro_batch, k=k, last_micro_batch=last,
      exact_by=EQUAL if last == micro_batch else WEIGHTED, **fields)


def _takes(build, name):
  """Whether `build` takes the keyword `name`."""
  try:
    parameters = inspect.signature(build).parameters
  except (TypeError, ValueError):
    return False
  return name in parameters or any(
      p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _option_choices(build, recompute, placement, device, replicas):
  """The (recompute, accumulator_placement) choices to weigh, the ones that
  save less memory first."""
  if recompute not in (True, False, "auto"):
    raise ValueError(f"recompute={recompute!r}: must be True, False or "
                     "'auto'")
  if placement not in ("device", "host", "auto"):
    raise ValueError(f"accumulator_placement={placement!r}: must be "
                     "'device', 'host' or 'auto'")
  for name, value in (("recompute", recompute),
                      ("accumulator_placement", placement)):
    if value not in ("auto", False, "device") and not _takes(build, name):
      raise ValueError(f"{name}={value!r}: build takes no {name} keyword, "
                       "so the planner cannot build the step with it")
  recomputes = [recompute is True]
  if recompute == "auto" and _takes(build, "recompute"):
    recomputes = [False, True]
  placements = ["host" if placement == "host" else "device"]
  if (placement == "auto" and _takes(build, "accumulator_placement") and
      device.upper().startswith("GPU") and replicas == 1):
    placements = ["device", "host"]
  return [(r, p) for p in placements for r in recomputes]


def _build_options(build, recompute, placement):
  """The memory keywords to call `build` with: those it takes."""
  options = {"recompute": recompute, "accumulator_placement": placement}
  return {name: value for name, value in options.items()
          if _takes(build, name)}


def _modelled_plan(build, plan, candidates, choices, log, started,
                   memory_budget_mb, measure_one, measured):
  """plan_micro_batch over several memory options: two points measured
  per choice, the rest modelled, the choice checked. `measured`: the
  Measurements already made, by (choice, micro-batch)."""

  def measure(choice, micro_batch):
    if (choice, micro_batch) not in measured:
      measured[choice, micro_batch] = _measured(
          build, plan, choice, micro_batch, measure_one, log)
    return measured[choice, micro_batch]

  fits = []
  for choice in choices:
    excluded = {key for key, m in measured.items()
                if not plan.fits(m.peak_bytes)}
    if search.cannot_gain(fits, candidates, plan.limit_bytes, excluded):
      break
    points = [measure(choice, m) for m in search.points_to_measure(
        candidates)]
    points = [p for p in points if p.peak_bytes is not None]
    if points:
      fits.append(search.Fit.of(choice, points))
  excluded = {key for key, m in measured.items()
              if not plan.fits(m.peak_bytes)}
  chosen = None
  for _ in range(search.MAX_CHECKS):
    picked = search.best(fits, candidates, plan.limit_bytes, excluded)
    if picked is None:
      break
    choice, micro_batch, reason = picked
    if plan.fits(measure(choice, micro_batch).peak_bytes):
      chosen = picked
      break
    excluded |= {(choice, m) for m in candidates if m >= micro_batch}
  if chosen is None:
    fitting = [key for key, m in measured.items() if plan.fits(m.peak_bytes)]
    if not fitting:
      needs = {memory_options_name(*fit.options):
               f"about {megabytes(int(fit.peak(candidates[0])))}"
               for fit in fits}
      needs.update({m.options: "more" if m.peak_bytes is None else
                    megabytes(m.peak_bytes) for m in measured.values()
                    if m.micro_batch == candidates[0]})
      raise _over_budget(plan, memory_budget_mb, candidates[0], needs)
    key = max(fitting, key=lambda key: key[1] / measured[key].step_seconds)
    chosen = (*key, "the fastest point measured that fits")
  choice, micro_batch, reason = chosen
  return _split(plan, micro_batch, measurements=tuple(measured.values()),
                planning_seconds=time.perf_counter() - started,
                recompute=choice[0], accumulator_placement=choice[1],
                reason=reason)


def _measured_line(measurement):
  peak = ("out of memory" if measurement.peak_bytes is None
          else megabytes(measurement.peak_bytes))
  speed = ("" if measurement.seconds_per_example is None else
           f", {measurement.seconds_per_example * 1000:.1f} ms/example")
  return (f"micro-batch {measurement.micro_batch} (k={measurement.k}"
          f"{labelled(measurement.options)}): {peak}{speed}")


def _build_from(build, model_fn, input_fn, params):
  """`build`, or the step of `model_fn` on `input_fn`; exactly one."""
  if (build is None) == (model_fn is None and input_fn is None):
    raise ValueError("plan_micro_batch: give either build (a function of "
                     "micro_batch and k) or model_fn and input_fn")
  if build is not None:
    check_build(build)
    return build
  if not callable(model_fn) or not callable(input_fn):
    raise ValueError("plan_micro_batch: model_fn and input_fn go together, "
                     "both callables")
  return estimator_step(model_fn, input_fn, params)


def _largest_fitting(count, fits):
  """The largest index in range(count) with fits(index), or None: tried
  from the largest down, stopping at the first that fits. Larger
  candidates take longer to measure, so this costs less than bisection
  whenever the answer is among the larger half, the usual case."""
  for index in reversed(range(count)):
    if fits(index):
      return index
  return None
