"""What a window costs, read from the job's first windows, and what a larger
k would save.

A window of k micro-batches takes k steps: k - 1 that add gradients and one
that also all-reduces the window and applies it. The difference between
that last step and the others is the window's end: across hosts, mostly
the all-reduce, whose time does not grow with k. So with t the time of a
micro-batch and e the end's extra time, a window takes k t + e; a larger
k spends the same e on more examples.

`measure(step_seconds, k, first_position)` reads t and e (medians) from a
job's step times; given each step's work too (`work`: run_classifier's
token positions), it compares each window-ending step with what a step of
that work takes (a robust line through the other steps), not with the
median step: a window sorted by length ends on its longest micro-batch,
whose extra compute is not the end's; `WindowCost.describe()` says it in one line, with what
k x 2 and k x 4 would give. `AccumulationLoggingHook` logs that line once,
after the first windows.
"""

import dataclasses
import statistics


@dataclasses.dataclass(frozen=True)
class WindowCost:
  """The cost of a window of `k` micro-batches.

  Attributes:
    k: micro-batches per window.
    micro_batch_seconds: median time of a step that ends no window.
    end_seconds: median time a window-ending step takes beyond that (the
      all-reduce and the apply), >= 0.
  """

  k: int
  micro_batch_seconds: float
  end_seconds: float

  @property
  def window_seconds(self):
    return self.k * self.micro_batch_seconds + self.end_seconds

  @property
  def end_share(self):
    """The share of the window its end takes."""
    return self.end_seconds / self.window_seconds

  def with_k(self, k):
    """The same job with windows of `k` micro-batches."""
    return dataclasses.replace(self, k=k)

  def speedup(self, k):
    """Examples per second with windows of `k`, over this k's."""
    other = self.with_k(k)
    return (k / other.window_seconds) / (self.k / self.window_seconds)

  def describe(self, factors=(2, 4)):
    """One line: the window, its end's share, and larger k's."""
    larger = ", ".join(
        f"k={self.k * f} would spend {self.with_k(self.k * f).end_share:.0%} "
        f"there ({self.speedup(self.k * f):.2f}x the examples/sec)"
        for f in factors)
    return (f"window cost: {self.k} micro-batches of "
            f"{self.micro_batch_seconds:.3f} s, and its end "
            f"{self.end_seconds:.3f} s more (all-reduce and apply: "
            f"{self.end_share:.0%} of the window's {self.window_seconds:.2f}"
            f" s); {larger}")


def measure(step_seconds, k, first_position, skip_windows=1, work=None):
  """The `WindowCost` of a job from its step times.

  Args:
    step_seconds: list of float, the time of consecutive steps.
    k: micro-batches per window.
    first_position: int, the micro-batch the first time is of (the global
      step it ran at).
    skip_windows: windows left out at the start (warm-up).
    work: optional list of numbers, each step's work (as many as
      `step_seconds`): a step's compute is then taken as a + b * work,
      fitted through the steps that end no window.

  Returns:
    A WindowCost, or None when no complete window (after the skipped ones)
    with steps that end no window is in `step_seconds`, or when the steps
    give no positive micro-batch time.
  """
  if work is None:
    work = [1.0] * len(step_seconds)
  ends, others = [], []
  windows_seen = 0
  for offset, (seconds, done) in enumerate(zip(step_seconds, work)):
    position = first_position + offset
    ends_window = (position + 1) % k == 0
    if windows_seen >= skip_windows:
      (ends if ends_window else others).append((seconds, float(done)))
    if ends_window:
      windows_seen += 1
  if not ends or (k > 1 and not others):
    return None
  if k == 1:
    return WindowCost(k, statistics.median(s for s, _ in ends), 0.0)
  compute = _compute_seconds(others)
  micro_batch = compute(statistics.median(w for _, w in ends + others))
  if micro_batch <= 0:
    return None
  end = max(statistics.median(s - compute(w) for s, w in ends), 0.0)
  return WindowCost(k, micro_batch, end)


def _compute_seconds(steps):
  """work -> seconds: a line through `steps` ((seconds, work) pairs) that
  outliers do not bend (Theil-Sen: the median of the pairwise slopes, and
  the median intercept), or their median where their work does not vary or
  the slope comes out negative (more work is never faster: a first run of
  a new shape, slower by its one-time setup, can tip a few points that
  way, and a least-squares line through them once gave a negative
  micro-batch time)."""
  median = statistics.median(s for s, _ in steps)
  slopes = [(s2 - s1) / (w2 - w1)
            for i, (s1, w1) in enumerate(steps)
            for s2, w2 in steps[i + 1:] if w2 != w1]
  if not slopes:
    return lambda unused: median
  slope = statistics.median(slopes)
  if slope <= 0:
    return lambda unused: median
  intercept = statistics.median(s - slope * w for s, w in steps)
  return lambda work: intercept + slope * work
