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
  """A linear model of one option choice's peak and micro-batch time.

  The peak is the larger of two lines when the micro-batches that add and
  the one that ends the window were measured apart: a micro-batch that
  adds grows with its examples from the model's state, and the window's
  end adds the optimizer's temporaries, which do not grow; at small
  micro-batches the window's end is the peak, at large ones the adding.
  """
  options: tuple
  lines: tuple  # ((static bytes, bytes per example), ...)
  fixed_seconds: float
  seconds_per_example: float
  largest_measured: int

  @classmethod
  def of(cls, options, measurements):
    """From one or two Measurements of `options` that did not run out of
    memory, the smaller micro-batch first."""
    first = measurements[0]
    if len(measurements) == 1:
      return cls(options, ((first.peak_bytes, 0.0),), 0.0,
                 first.step_seconds / first.micro_batch, first.micro_batch)
    second = measurements[1]
    span = second.micro_batch - first.micro_batch

    def line(small, large):
      slope = max((large - small) / span, 0.0)
      return (small - slope * first.micro_batch, slope)

    kinds = [("peak_bytes",)]
    if all(getattr(m, "adding_peak_bytes", None) is not None and
           getattr(m, "window_end_peak_bytes", None) is not None
           for m in (first, second)):
      kinds = [("adding_peak_bytes",), ("window_end_peak_bytes",)]
    lines = tuple(line(getattr(first, kind), getattr(second, kind))
                  for (kind,) in kinds)
    seconds = max((second.step_seconds - first.step_seconds) / span, 0.0)
    return cls(options, lines,
               max(first.step_seconds - seconds * first.micro_batch, 0.0),
               seconds, second.micro_batch)

  @property
  def bytes_per_example(self):
    return max(slope for _, slope in self.lines)

  def peak(self, micro_batch):
    return max(static + slope * micro_batch for static, slope in self.lines)

  def examples_per_second(self, micro_batch):
    seconds = self.fixed_seconds + self.seconds_per_example * micro_batch
    return micro_batch / max(seconds, 1e-9)


def points_to_measure(candidates):
  """The two micro-batches each option is measured at: the second and
  fourth candidates (the smallest is slow per example for reasons that do
  not grow with the micro-batch, and would skew the time's line), or the
  smallest and the largest of fewer."""
  if len(candidates) >= 4:
    return [candidates[1], candidates[3]]
  return sorted({candidates[0], candidates[-1]})


def cannot_gain(fits, candidates, limit, excluded):
  """Whether no option saving more memory can make a faster plan than the
  modelled best of `fits`: none runs faster than the first option at the
  largest micro-batch, and that is within SAVING_MUST_GAIN of it."""
  picked = best(fits, candidates, limit, excluded)
  if picked is None:
    return False
  options, micro_batch, _ = picked
  fit = next(f for f in fits if f.options == options)
  ceiling = fits[0].examples_per_second(candidates[-1])
  return fit.examples_per_second(micro_batch) * SAVING_MUST_GAIN >= ceiling


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
    speed = max(fit.examples_per_second(m) for m in fitting)
    # Within the model's noise of the fastest, the largest micro-batch:
    # fewer windows, and the planner's choice without a model.
    micro_batch = max(m for m in fitting
                      if fit.examples_per_second(m) >= 0.98 * speed)
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
