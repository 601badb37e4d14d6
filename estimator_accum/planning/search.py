"""Choosing among memory options: a few points measured, the rest modelled.

When the planner may also recompute activations or keep the accumulators
on the host, it measures each choice of those options at two small
micro-batches and models the rest, as DeepSpeed's autotuner and
OpenNMT-tf's batch-size search do: a step's peak is linear in the
micro-batch (the weights, slots and accumulators, plus activations per
example), and so is its time. It picks the micro-batch and options with
the most examples per second whose modelled peak fits, measures that point
to check it, and steps down when the check does not fit.

A memory-saving option (recomputation, host accumulators) costs time, so it
is chosen only where the options before it fit nothing, or where it is
measured at least `SAVING_MUST_GAIN` faster (a larger micro-batch on a GPU
can pay for recomputation): noise alone does not choose it.
"""

import dataclasses

# How much faster a memory-saving option must model to be chosen over one
# that fits without it.
SAVING_MUST_GAIN = 1.1
# Checks of a modelled choice before settling for the best point measured.
MAX_CHECKS = 4


@dataclasses.dataclass(frozen=True)
class Fit:
  """A linear model of one option choice's peak and micro-batch time."""
  options: tuple
  static_bytes: float
  bytes_per_example: float
  fixed_seconds: float
  seconds_per_example: float
  largest_measured: int

  @classmethod
  def of(cls, options, measurements):
    """From one or two Measurements of `options` that did not run out of
    memory, the smaller micro-batch first."""
    first = measurements[0]
    if len(measurements) == 1:
      return cls(options, first.peak_bytes, 0.0, 0.0,
                 first.step_seconds / first.micro_batch, first.micro_batch)
    second = measurements[1]
    span = second.micro_batch - first.micro_batch
    per_example = max((second.peak_bytes - first.peak_bytes) / span, 0.0)
    seconds = max((second.step_seconds - first.step_seconds) / span, 0.0)
    return cls(options, first.peak_bytes - per_example * first.micro_batch,
               per_example,
               max(first.step_seconds - seconds * first.micro_batch, 0.0),
               seconds, second.micro_batch)

  def peak(self, micro_batch):
    return self.static_bytes + self.bytes_per_example * micro_batch

  def examples_per_second(self, micro_batch):
    seconds = self.fixed_seconds + self.seconds_per_example * micro_batch
    return micro_batch / max(seconds, 1e-9)


def points_to_measure(candidates):
  """The two micro-batches each option is measured at: the smallest
  candidate and the third (or the largest, when fewer)."""
  if len(candidates) == 1:
    return candidates[:1]
  return [candidates[0], candidates[min(2, len(candidates) - 1)]]


def best(fits, candidates, limit, excluded):
  """(options, micro_batch, reason) of the modelled choice, or None when
  nothing fits. `fits`: Fits in order of cost (plain first); `excluded`:
  {(options, micro_batch)} measured too big."""
  chosen, reason = None, ""
  for fit in fits:
    fitting = [m for m in candidates
               if (fit.options, m) not in excluded and fit.peak(m) <= limit and
               not (fit.bytes_per_example == 0 and m > fit.largest_measured)]
    if not fitting:
      continue
    micro_batch = max(fitting, key=fit.examples_per_second)
    speed = fit.examples_per_second(micro_batch)
    if chosen is None:
      reason = ("it fits without saving more memory" if fit is fits[0] else
                "no option that saves less memory fits")
      chosen = (fit, micro_batch, speed)
    elif speed >= SAVING_MUST_GAIN * chosen[2]:
      reason = (f"models {speed / chosen[2]:.2f}x the examples/sec of the "
                f"best without it")
      chosen = (fit, micro_batch, speed)
  if chosen is None:
    return None
  fit, micro_batch, speed = chosen
  return fit.options, micro_batch, (
      f"{reason}; modelled {speed:.1f} examples/sec and peak "
      f"{fit.peak(micro_batch) / 2**20:.1f} MB")
