"""The micro-batch plan as a value: how an effective batch is split into
replicas x micro-batch x k, the measurements it was chosen from, and its
text (`describe`, `summary`) and file (`write`, `read`) forms.

Made by the planner (`planner.plan_micro_batch`, from measurements) or by
hand (`MicroBatchPlan.given(effective_batch, micro_batch)`); halved after
running out of memory (`halved`).
"""

import dataclasses
import json

import tensorflow as tf

from estimator_accum import _checks, _files

EQUAL = "equal micro-batches"
WEIGHTED = "num_examples weighting"
# `MicroBatchPlan.fits()` asked of the plan's own micro-batch.
_OWN = object()


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One candidate: its micro-batch, k, and peak bytes (None: the
  allocator ran out of memory); `seconds` to measure it, and
  `step_seconds`, the mean time of its micro-batches after the first (None
  when it ran out of memory). `recompute` and `accumulator_placement`: the
  memory options it was built with."""
  micro_batch: int
  k: int
  peak_bytes: int | None
  seconds: float
  step_seconds: float | None = None
  recompute: bool = False
  accumulator_placement: str = "device"
  # After the first window: the peak of a micro-batch that only adds, and
  # of one that ends the window and applies (None: not measured).
  adding_peak_bytes: int | None = None
  window_end_peak_bytes: int | None = None
  # The median time of a whole window of k micro-batches on the input the
  # job trains on (plan_micro_batch(objective="fastest"); None: not timed).
  window_seconds: float | None = None
  # True when the peak is the timed run's (the input as the job arranges
  # it), not a measurement for memory (the longest input).
  peak_timed: bool = False

  @property
  def seconds_per_example(self):
    if self.step_seconds is None:
      return None
    return self.step_seconds / self.micro_batch

  @property
  def options(self):
    """How it was built: "plain", "recompute", "host accumulators", ..."""
    return memory_options_name(self.recompute, self.accumulator_placement)


def memory_options_name(recompute, accumulator_placement):
  """The words the plans print for a choice of memory options."""
  words = ["recompute"] if recompute else []
  if accumulator_placement != "device":
    words.append(f"{accumulator_placement} accumulators")
  return " + ".join(words) or "plain"


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
  """How to split `effective_batch` examples per update.

  Each of `replicas` data-parallel replicas (workers x devices) trains
  micro-batches of `micro_batch` examples, k of them per update; when
  `micro_batch` does not divide the replica's share, the last micro-batch of
  every window holds `last_micro_batch` examples and the window is exact
  only with `num_examples` weighting (`exact_by`).
  """
  effective_batch: int
  replicas: int
  micro_batch: int
  k: int
  last_micro_batch: int
  exact_by: str
  budget_bytes: int | None
  margin: float
  device: str
  measurements: tuple = ()
  planning_seconds: float = 0.0
  halvings: int = 0
  # The memory options the plan trains with.
  recompute: bool = False
  accumulator_placement: str = "device"
  # Why this plan, when several memory options were weighed.
  reason: str = ""

  @property
  def peaks(self):
    """{micro_batch: measured peak bytes (None: out of memory)}."""
    return {m.micro_batch: m.peak_bytes for m in self.measurements}

  @property
  def per_replica(self):
    return self.effective_batch // self.replicas

  def fits(self, peak_bytes=_OWN):
    """Whether a micro-batch of `peak_bytes` fits under the budget (not
    given: the plan's own micro-batch, as measured). Without a budget (a
    plan given by hand) whatever ran fits; a micro-batch that ran out of
    memory (None) never does."""
    if peak_bytes is _OWN:
      if self.micro_batch not in self.peaks:
        return self.budget_bytes is None
      peak_bytes = self.peaks[self.micro_batch]
    if peak_bytes is None:
      return False
    return self.limit_bytes is None or peak_bytes <= self.limit_bytes

  @property
  def limit_bytes(self):
    """The budget less the margin: a candidate fits if its peak is at most
    this (None: no budget)."""
    if self.budget_bytes is None:
      return None
    return int(self.budget_bytes * (1 - self.margin))

  def halved(self):
    """The plan after running out of memory: half the micro-batch, twice
    k, the same effective batch. ValueError when that is not exact."""
    if self.micro_batch == 1 or self.micro_batch % 2 or (
        self.last_micro_batch != self.micro_batch):
      raise ValueError(
          f"micro-batch {self.micro_batch} x k={self.k} cannot be halved "
          "into equal micro-batches")
    return dataclasses.replace(
        self, micro_batch=self.micro_batch // 2, k=self.k * 2,
        last_micro_batch=self.micro_batch // 2, halvings=self.halvings + 1)

  @property
  def options(self):
    """The memory options, as words: "plain", "recompute", ..."""
    return memory_options_name(self.recompute, self.accumulator_placement)

  def summary(self):
    """One line: the split."""
    text = (f"effective batch {self.effective_batch} = {self.replicas} "
            f"replica(s) x micro-batch {self.micro_batch} x k={self.k}")
    if self.options != "plain":
      text += f", {self.options}"
    if self.last_micro_batch != self.micro_batch:
      text += (f" (each window's last micro-batch holds "
               f"{self.last_micro_batch}; exact by {self.exact_by})")
    return text

  def describe(self):
    """The plan as printed: the candidates measured, their peaks, the
    choice and the planning time."""
    if not self.measurements and self.budget_bytes is None:
      return f"micro-batch plan given by hand, nothing measured: {self.summary()}"
    if self.budget_bytes is None:
      lines = [f"micro-batch plan on {self.device}: no memory budget"]
    else:
      lines = [f"micro-batch plan on {self.device}: budget "
               f"{megabytes(self.budget_bytes)}, margin {self.margin:.0%}, "
               f"so a micro-batch fits under {megabytes(self.limit_bytes)}"]
    weighed = bool(self.reason)
    for measured in sorted(self.measurements,
                           key=lambda m: (m.options, -m.micro_batch)):
      peak = ("out of memory" if measured.peak_bytes is None
              else f"peak {megabytes(measured.peak_bytes)}" +
              (" when timed" if measured.peak_timed else ""))
      verdict = "fits" if self.fits(measured.peak_bytes) else "too big"
      options = labelled(measured.options)
      speed = ("" if measured.seconds_per_example is None or not weighed else
               f"{measured.seconds_per_example * 1000:.1f} ms/example, ")
      if measured.window_seconds is not None:
        speed = f"window {measured.window_seconds:.3f} s, "
      chosen = "  <- chosen" if (
          measured.micro_batch, measured.recompute,
          measured.accumulator_placement) == (
              self.micro_batch, self.recompute,
              self.accumulator_placement) else ""
      lines.append(f"  micro-batch {measured.micro_batch:>4} (k={measured.k}"
                   f"{options}): {peak}, {verdict} ({speed}"
                   f"{measured.seconds:.1f} s){chosen}")
    if weighed:
      lines.append(f"chose micro-batch {self.micro_batch} x k={self.k}"
                   f"{labelled(self.options)}: {self.reason}")
    lines.append(f"{self.summary()}; planned in "
                 f"{self.planning_seconds:.1f} s ({len(self.measurements)} "
                 f"candidate(s) measured)")
    return "\n".join(lines)

  def to_dict(self):
    data = dataclasses.asdict(self)
    data["measurements"] = [dataclasses.asdict(m) for m in self.measurements]
    return data

  @classmethod
  def from_dict(cls, data):
    """The plan `to_dict` gave."""
    data = dict(data)
    data["measurements"] = tuple(Measurement(**m)
                                 for m in data.get("measurements", ()))
    return cls(**data)

  def write(self, path):
    """Writes the plan as JSON to `path`, atomically (a reader, another
    worker waiting for it, sees the whole plan or none)."""
    _files.write_whole(path, json.dumps(self.to_dict(), indent=1))

  @classmethod
  def read(cls, path):
    """The plan `write` wrote to `path`."""
    with tf.io.gfile.GFile(path) as reader:
      return cls.from_dict(json.load(reader))

  @classmethod
  def given(cls, effective_batch, micro_batch, replicas=1):
    """A plan chosen by hand (no measurement): `micro_batch` must divide
    the replica's share of `effective_batch`."""
    share = replica_share(effective_batch, replicas)
    micro_batch = _checks.check_positive_int("micro_batch", micro_batch)
    if share % micro_batch:
      raise ValueError(
          f"micro_batch={micro_batch} does not divide the "
          f"{share} examples per replica of effective_batch="
          f"{effective_batch}")
    return cls(effective_batch, replicas, micro_batch, share // micro_batch,
               micro_batch, EQUAL, None, 0.0, "given")


def megabytes(num_bytes):
  if num_bytes is None:
    return "no budget"
  megabytes = num_bytes / 2**20
  return f"{megabytes:.1f} MB" if megabytes >= 10 else f"{megabytes:.3g} MB"


def replica_share(effective_batch, replicas):
  if effective_batch is None:
    raise ValueError("effective_batch is required: the examples per update "
                     "over all replicas")
  effective_batch = _checks.check_positive_int("effective_batch",
                                               effective_batch)
  replicas = _checks.check_positive_int("replicas", replicas)
  if effective_batch % replicas:
    raise ValueError(
        f"effective_batch={effective_batch} is not a multiple of the "
        f"{replicas} replicas: each replica must take the same share")
  return effective_batch // replicas


def labelled(options):
  """", recompute" and the like; nothing for plain training."""
  return "" if options == "plain" else f", {options}"
