"""How a window's micro-batches combine into its gradient, chosen once.

`for_options(reduction, num_examples)` picks one of four reductions, as
optax's `MultiSteps` picks its accumulation rule in `__init__`; nothing
else asks which one it is. Each owns the state its rule needs (what the
mean divides by) and acts at four moments of a window:

  `build`      once: makes its state variables (after the accumulators).
  `add`        every micro-batch, replica context: adds the micro-batch's
               gradients to the accumulators, weighted as the rule says.
  `local`      the window's end, replica context: this replica's sums and
               weight, in a form that sums over replicas.
  `finish`     the window's end, after the all-reduce: the window's gradient
               from the sums over every replica.
  `reset`      replica context, after the window: its per-window state zeroed.
  `after_window`  cross-replica context, after the window: state carried to
               the next window.

| class | option | each micro-batch adds | the window's gradient |
| --- | --- | --- | --- |
| `Mean` | "mean" | g / (k x replicas) | the sums |
| `WeightedMean` | "mean" with num_examples | n x g | sums / examples |
| `Sum` | "sum" | g | the sums |
| `RunningMean` | "running_mean" | the mean so far, updated | mean x weight, / weight |
"""

import tensorflow as tf

from estimator_accum.checkpoints.state_variables import StateVariables
from estimator_accum.window.gradient_ops import scale_gradient

# Dtype of the window's micro-batch and example counts and of its divisor,
# whatever the accumulators' dtype: counts stay exact (bfloat16 holds whole
# numbers only up to 256).
COUNT_DTYPE = tf.float32


def for_options(reduction, num_examples):
  """The `Reduction` for the option `reduction` ("mean", "sum",
  "running_mean", checked already) and the `num_examples` tensor weighting
  each micro-batch (None: each counts as one).

  Raises:
    ValueError: `num_examples` with a reduction that does not weigh
      micro-batches (the sum).
  """
  return _BY_OPTION[reduction].made(num_examples)


def _after(gradients):
  """A scope whose ops wait for the micro-batch's gradients: a step whose
  input has ended (OutOfRangeError) still runs every op that does not need
  the input, and would count a micro-batch it never added."""
  return tf.control_dependencies(
      [getattr(g, "values", g) for g in gradients])


def _one():
  return tf.constant(1.0, COUNT_DTYPE)


class Reduction:
  """The interface; see the module docstring.

  Attributes:
    holds_mean: bool, whether the accumulators hold a mean (saved in
      checkpoints as the mean over replicas) rather than a sum.
    counts_micro_batches: bool, whether `local`'s weight counts
      micro-batches (the window then reports one that held other than k
      per replica: a run resumed with another k).
  """

  holds_mean = False
  counts_micro_batches = False
  # Whether the window's gradient is divided by the replicas (a mean), as
  # opposed to summed over them.
  divides_by_replicas = True
  # Whether the rule averages micro-batch losses that should be means, so
  # that a loss summed over its batch deserves a warning.
  averages_mean_losses = True
  # Whether the rule can weigh each micro-batch by its examples.
  weighs_examples = True
  # Whether a micro-batch's weight is the same on every replica, so that
  # the micro-batch can be summed over replicas before it is weighed
  # (sharded accumulators).
  weighs_replicas_alike = True

  @classmethod
  def made(cls, num_examples):
    """The rule of this option for micro-batches weighted by
    `num_examples` (a tensor, or None)."""
    return cls(num_examples)

  def build(self, name, window_size, variables):
    """Makes the state variables, named under `name`. `window_size`: k x
    replicas of this run; `variables`: the build's `StateVariables`."""
    del name, window_size, variables

  def state_variables(self):
    """The variables of the state it made, in the order made."""
    return []

  def add(self, accumulators, gradients, unscaled):
    """The ops adding one micro-batch: (one op per accumulator, adding to
    it; the ops updating the rule's own state). `unscaled(w)` is the
    float32 weight `w` (None for 1) divided by the loss scale, in the
    accumulators' dtype (None when both are 1).

    The window's end reads an accumulator as soon as its own op has run
    (its all-reduce overlaps the rest of the backward pass) and the rule's
    state once every op has."""
    raise NotImplementedError

  def local(self, sums):
    """(sums, weight): this replica's `sums` as they sum over replicas,
    and its weight (float32 scalar, or None when the rule has none)."""
    return sums, None

  def finish(self, sums, weight):
    """(gradients, factor): the window's gradient from `sums` and `weight`
    over every replica, up to `factor` (a float32 scalar to multiply
    by, or None for 1), which the window folds into clipping."""
    del weight
    return sums, None

  def reset(self):
    """The ops zeroing this replica's state (replica context)."""
    return []

  def after_window(self):
    """The ops carrying state to the next window (cross-replica)."""
    return []


class Sum(Reduction):
  """The sum over the window and the replicas: for summed losses."""

  divides_by_replicas = False
  averages_mean_losses = False
  weighs_examples = False

  @classmethod
  def made(cls, num_examples):
    if num_examples is not None:
      raise ValueError(
          "num_examples weights each micro-batch's mean gradient by its size "
          "and has no meaning with reduction='sum'; pass num_examples=None or "
          "use reduction='mean'.")
    return cls()

  def add(self, accumulators, gradients, unscaled):
    weight = unscaled(None)
    return [a.add(g, weight) for a, g in zip(accumulators, gradients)], []


class _Weighted(Reduction):
  """A rule that divides by a weight: micro-batches or examples."""

  def __init__(self, num_examples=None):
    self._num_examples = num_examples
    self._weight = None

  def _weight_name(self):
    return ("window_micro_batches" if self._num_examples is None
            else "window_examples")

  def build(self, name, window_size, variables):
    self._weight = (variables or StateVariables())(
        f"{name}/{self._weight_name()}", [], COUNT_DTYPE, per_replica=True)

  def state_variables(self):
    return [self._weight]

  def _micro_batch_weight(self):
    """This micro-batch's weight: its examples, or 1."""
    if self._num_examples is None:
      return _one()
    return tf.cast(self._num_examples, COUNT_DTYPE)

  def local(self, sums):
    return sums, self._weight.read_value()

  def finish(self, sums, weight):
    return [scale_gradient(s, 1.0 / weight) for s in sums], None

  def reset(self):
    return [self._weight.assign(tf.zeros([], COUNT_DTYPE), read_value=False)]


class WeightedMean(_Weighted):
  """The mean over the window's examples: each micro-batch's gradient
  (itself a mean) weighted by its `num_examples`, so that uneven
  micro-batches give their big batch's mean exactly."""

  weighs_replicas_alike = False

  def add(self, accumulators, gradients, unscaled):
    weight = self._micro_batch_weight()
    with _after(gradients):
      counted = self._weight.assign_add(weight, read_value=False)
    weight = unscaled(weight)
    return [a.add(g, weight) for a, g in zip(accumulators, gradients)], [
        counted]


class Mean(_Weighted):
  """The mean over the window's micro-batches, k x replicas of them.

  Each micro-batch is added already divided by k x replicas, so that the
  window's sum is its gradient: the apply step hands the optimizer the
  accumulators themselves, not a scaled copy the size of the model. That
  divisor is state saved with the window: a run resumed with another k or
  number of replicas goes on adding with the divisor its window began with,
  and the window's end multiplies by divisor / micro-batches held, which is
  exactly 1 in every other window.
  """

  counts_micro_batches = True

  @classmethod
  def made(cls, num_examples):
    return cls() if num_examples is None else WeightedMean(num_examples)

  def __init__(self):
    super().__init__(None)
    self._divisor = None
    self._window_size = None

  def build(self, name, window_size, variables):
    super().build(name, window_size, variables)
    self._window_size = window_size
    self._divisor = (variables or StateVariables())(
        f"{name}/window_divisor", [], COUNT_DTYPE, per_replica=False,
        initial_value=float(window_size))

  def state_variables(self):
    return super().state_variables() + [self._divisor]

  def add(self, accumulators, gradients, unscaled):
    with _after(gradients):
      counted = self._weight.assign_add(_one(), read_value=False)
    weight = unscaled(tf.math.reciprocal(self._divisor.read_value()))
    return [a.add(g, weight) for a, g in zip(accumulators, gradients)], [
        counted]

  def finish(self, sums, weight):
    # The sums are the window's gradient times this factor, which is 1
    # except in a window that straddles a resume with another k or number
    # of replicas.
    return sums, self._divisor.read_value() / weight

  def after_window(self):
    # The next window is added with this run's k * replicas.
    return [self._divisor.assign(
        tf.constant(self._window_size, COUNT_DTYPE), read_value=False)]


class RunningMean(_Weighted):
  """The accumulators hold the window's mean so far, which keeps
  low-precision accumulators in range:

    mean_t = mean_{t-1} * (1 - f) + f * g_t,  f = w_t / W_t

  (the share of this micro-batch in the weight seen so far: its examples,
  or 1 of its micro-batches). Checkpoints keep the mean over replicas,
  which a restore onto any number of replicas gives to each."""

  holds_mean = True
  averages_mean_losses = False
  weighs_replicas_alike = False

  @property
  def counts_micro_batches(self):
    return self._num_examples is None

  def add(self, accumulators, gradients, unscaled):
    weight = self._micro_batch_weight()
    with _after(gradients):
      seen = self._weight.assign_add(weight)
    fraction = weight / seen
    with tf.control_dependencies([seen]):
      keep = unscaled.in_accumulator_dtype(1.0 - fraction)
      decays = [a.decay(keep) for a in accumulators]
    with tf.control_dependencies(decays):
      fraction = unscaled(fraction)
      return [a.add(g, fraction)
              for a, g in zip(accumulators, gradients)], [seen]

  def local(self, sums):
    # Rebuilt as mean x weight, so that replicas combine as sums do.
    weight = self._weight.read_value()
    return [scale_gradient(s, tf.cast(weight, s.dtype)) for s in sums], weight


_BY_OPTION = {"mean": Mean, "sum": Sum, "running_mean": RunningMean}
