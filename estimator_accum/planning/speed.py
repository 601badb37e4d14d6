"""Which split of the effective batch trains fastest: whole windows timed.

Every split of an effective batch into micro-batch x k trains the same
update, so the fastest split that fits is free speed. A micro-batch's time
is not linear in its size: a matrix product on more rows runs at a better
rate, and each micro-batch pays a session call and the accumulators' adds
whatever its size (on a 2-core CPU, the main job's 32 x 1 ran 1.19x the
examples/sec of its 8 x 4). So `plan_micro_batch(objective="fastest")`
times them: from the largest that fits (by memory) down, each split is
built at its own k on the input the job trains on (`speed_build`: its
examples' real lengths, arranged as it arranges its windows), one window
is run untimed (its end makes the optimizer's slots and compiles a fused
apply), then `windows` whole windows are timed. Every candidate's
windows hold the same examples (the replica's share of the effective
batch, from the same seeded input), so the split with the shortest window
is the fastest. A smaller split must
be at least 3% shorter (MUST_GAIN); timing stops at a split 8% slower
than the fastest (GIVE_UP), and after 4 (MAX_TIMED).
"""

import dataclasses
import gc
import statistics
import time

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.planning import measure

# Windows timed per candidate, after one untimed.
DEFAULT_WINDOWS = 8
# A smaller micro-batch is chosen over a larger one only when its window is
# at least this much shorter: closer than that is the machine's noise, and
# the larger one runs fewer session calls.
MUST_GAIN = 0.03
# Timing stops at a candidate this much slower than the fastest so far:
# smaller micro-batches only pay more per example from there (each split
# timed is a graph built: ~12 s for the main job's).
GIVE_UP = 0.08
# At most this many candidates are timed.
MAX_TIMED = 4


def check_arguments(objective, speed_build, windows):
  """plan_micro_batch's speed arguments checked, in one line each; returns
  `windows` as an int."""
  if objective not in ("largest", "fastest"):
    raise ValueError(f"objective={objective!r}: must be 'largest' or "
                     "'fastest'")
  if speed_build is not None:
    measure.check_build(speed_build)
  return _checks.check_positive_int("speed_windows", windows, limit=1000)


def time_windows(build, micro_batch, k, device, windows=DEFAULT_WINDOWS,
                 session_config=None, **memory_options):
  """Builds `build(micro_batch, k, **memory_options)` in a fresh graph, runs
  one window of k micro-batches untimed and `windows` timed, and returns
  (the median window's seconds, the allocator's peak bytes over the timed
  windows on `device`; None when it ran out of memory)."""
  graph, config, fetch, init = measure.built_step(
      build, micro_batch, k, session_config, memory_options)
  seconds = []
  try:
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(init)
      for _ in range(k):
        session.run(fetch)
      tf.config.experimental.reset_memory_stats(device)
      for _ in range(windows):
        started = time.perf_counter()
        for _ in range(k):
          session.run(fetch)
        seconds.append(time.perf_counter() - started)
      peak = int(tf.config.experimental.get_memory_info(device)["peak"])
  except tf.errors.ResourceExhaustedError:
    return None, None
  except tf.errors.OutOfRangeError:
    raise ValueError(
        f"the input ended before {windows + 1} windows of {k} x "
        f"{micro_batch}: timing runs that many (repeat the input)") from None
  finally:
    del graph, fetch
    gc.collect()
  return statistics.median(seconds), peak


def fastest(plan, candidates, time_one, log=None):
  """The Measurements timed and the fastest, from `plan` (the largest
  micro-batch that fits, from memory) down through `candidates`
  (ascending).

  `time_one(micro_batch)` returns a Measurement with `window_seconds` (its
  peak None when it ran out of memory). Returns (timed measurements, the
  chosen one, the reason in words)."""
  timed, best = [], None
  below = sorted((m for m in candidates if m <= plan.micro_batch),
                 reverse=True)
  for micro_batch in below[:MAX_TIMED]:
    measurement = time_one(micro_batch)
    timed.append(measurement)
    if log:
      log(timed_line(measurement, plan))
    if not plan.fits(measurement.peak_bytes):
      continue
    if best is None or (measurement.window_seconds <
                        best.window_seconds * (1 - MUST_GAIN)):
      best = measurement
    elif measurement.window_seconds > best.window_seconds * (1 + GIVE_UP):
      break
  if best is None:
    return timed, None, ""
  largest = next(m for m in timed if plan.fits(m.peak_bytes))
  if best is largest:
    reason = (f"the fastest window timed that fits ({best.window_seconds:.3f}"
              f" s; {len(timed)} split(s) timed)")
  else:
    reason = (f"the fastest window timed that fits: {best.window_seconds:.3f}"
              f" s against {largest.window_seconds:.3f} s for micro-batch "
              f"{largest.micro_batch}, the largest that fits "
              f"({largest.window_seconds / best.window_seconds:.2f}x)")
  return timed, best, reason


def timed_line(measurement, plan):
  if measurement.peak_bytes is None:
    return (f"micro-batch {measurement.micro_batch} (k={measurement.k}): "
            "out of memory when timed")
  verdict = "" if plan.fits(measurement.peak_bytes) else ", too big"
  return (f"micro-batch {measurement.micro_batch} (k={measurement.k}): "
          f"window {measurement.window_seconds:.3f} s timed"
          f"{verdict}")


def merged(memory, timed):
  """The memory Measurements with the timed ones' window seconds (one
  Measurement per micro-batch and memory options; a timed micro-batch
  not measured for memory keeps its timed run's peak)."""
  by_key = {(m.micro_batch, m.options): m for m in memory}
  for measurement in timed:
    key = (measurement.micro_batch, measurement.options)
    if key in by_key and by_key[key].peak_bytes is not None:
      by_key[key] = dataclasses.replace(
          by_key[key], window_seconds=measurement.window_seconds)
    else:
      by_key[key] = dataclasses.replace(measurement, peak_timed=True)
  return tuple(sorted(by_key.values(),
                      key=lambda m: (m.options, -m.micro_batch)))
