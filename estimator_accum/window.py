"""The graph of one accumulation window (internal to estimator_accum).

`Window` builds, for one call of `build_accumulating_train_op`: the state
variables, the per-micro-batch accumulate ops (replica context), and the
end-of-micro-batch decision (cross-replica context, inside `merge_call`):
form the window's gradient, all-reduce it once, check it, clip it, apply it
through `call_for_each_replica`, and count it.
"""


import tensorflow as tf

from estimator_accum import window_reports
from estimator_accum.accumulators import Accumulator, rows_to_slices
from estimator_accum.batch_norm import claim_window_statistics
from estimator_accum.gradient_ops import (
  cast_gradient,
  scale_gradient,
  scale_unless_one,
  sum_over_replicas,
)
from estimator_accum.optimizer_apply import (
  AlreadyReduced,
  create_outside_control_flow,
  reduces_in_distributed_apply,
  reduction_taken_out,
)
from estimator_accum.sparse import CompactSparseAccumulator
from estimator_accum.state import AccumulationState
from estimator_accum.state_variables import state_variable

# The window all-reduce's packs default to settings.BYTES_PER_PACK, about
# 4 MB. One pack (TensorFlow's default) concatenates every gradient, reduces,
# and splits the result: two copies of the model and one collective that
# starts only when all of it is ready. Packs of about 4 MB run concurrently
# and leave variables of 4 MB and more uncopied (MLP of 3.2M parameters on 2
# CPU workers, k=8: apply step 59-67 ms against 74-90 ms with one pack, 5
# runs each; per-tensor packs and 2 MB alike, 8 MB in between).

# Dtype of the window's micro-batch and example counts and of its divisor,
# whatever the accumulators' dtype: counts stay exact (bfloat16 holds whole
# numbers only up to 256).
_COUNT_DTYPE = tf.float32

_STATUS_ACCUMULATED = 0
_STATUS_APPLIED = 1
_STATUS_SKIPPED = 2


class Window:
  """Builds the graph of one accumulation window."""

  def __init__(self, trained, optimizer, settings, global_step,
               num_examples=None, loss_scaler=None, local_device=None,
               compact=None, outer_scope="", progress=None):
    """Args: the micro-batch's [(gradient, variable)], the optimizer, the
    `WindowSettings`, the micro-batch counter, the `num_examples` tensor or
    None, the `LossScaler` or None, the worker's device in between-graph
    training or None, which variables accumulate compactly, the name scope
    the train op is built in, and the graph's ProgressLine or None."""
    k, name = settings.k, settings.name
    self._gradients = [g for g, _ in trained]
    # The name scope the train op is built in: see _outer_name_scope.
    self._outer_scope = outer_scope
    self._optimizer = optimizer
    self._k = k
    self._global_step = global_step
    self._clip_norm = settings.clip_norm
    self._num_examples = num_examples
    self._reduction = reduction = settings.reduction
    self._dtype = accumulator_dtype = settings.accumulator_dtype
    self._summaries = settings.summaries
    self._name = name
    self._loss_scaler = loss_scaler
    self._communication_options = settings.communication_options
    self._after_update = settings.after_update
    # The graph's ProgressLine, or None.
    self._progress = progress
    self._window_size = k * tf.distribute.get_strategy().num_replicas_in_sync
    # The batch_norm layers whose moving statistics this window updates.
    self._statistics = claim_window_statistics(k, name)
    compact = compact or [False] * len(trained)
    self._accumulators = [
        CompactSparseAccumulator(v, accumulator_dtype, local_device) if c
        else Accumulator(v, g, accumulator_dtype, local_device,
                         holds_mean=reduction == "running_mean")
        for (g, v), c in zip(trained, compact)]
    # Made in this order, which the Keras wrapper's weights follow.
    self._make_window_weight(name, num_examples, local_device)
    self._make_position_counter(name, global_step, local_device)
    self._make_counters(name, settings.max_consecutive_skipped_windows)
    self.state = AccumulationState(
        k, global_step, self._updates, self._skipped, self._norm,
        self._accumulators, loss_scaler.scale if loss_scaler else None)

  def _make_window_weight(self, name, num_examples, local_device):
    """The window's weight so far on this replica: its examples with
    num_examples, else its micro-batches. The mean divides by its sum over
    the replicas, which is k * replicas except in a window that straddles
    a resume with another k or number of replicas: that window is then
    still the mean of what it holds.

    For the plain mean each micro-batch is added already divided by
    k * replicas, so that the window's sum is its gradient: the apply step
    hands the optimizer the accumulators themselves, not a scaled copy the
    size of the model. That divisor is state saved with the window: a run
    resumed with another k or number of replicas goes on adding with the
    divisor its window began with, and the window's end multiplies by
    divisor / micro-batches held, which is exactly 1 in every other window.
    """
    reduction = self._reduction
    self._weight = None
    self._counts_micro_batches = num_examples is None and reduction != "sum"
    if reduction != "sum":
      self._weight = state_variable(
          name + ("/window_micro_batches" if self._counts_micro_batches
                  else "/window_examples"),
          [], _COUNT_DTYPE, per_replica=True, local_device=local_device)
    self._divisor = None
    if reduction == "mean" and num_examples is None:
      self._divisor = state_variable(
          name + "/window_divisor", [], _COUNT_DTYPE, per_replica=False,
          initial_value=float(self._window_size), local_device=local_device)

  def _make_position_counter(self, name, global_step, local_device):
    """The window's position: the global step, except in between-graph
    training, where the global step is shared by workers that each keep
    their own window and count their own micro-batches."""
    self._position_counter = global_step
    if local_device is not None:
      self._position_counter = state_variable(
          name + "/local_micro_batches", [], tf.int64, per_replica=True,
          local_device=local_device)

  def _make_counters(self, name, max_skipped):
    """Updates applied, windows skipped, the last norm; and the windows
    skipped in a row in this run (not saved: a resumed run starts counting
    again), None when no number of them stops training."""
    self._updates = state_variable(
        name + "/updates_applied", [], tf.int64, per_replica=False)
    self._skipped = state_variable(
        name + "/skipped_windows", [], tf.int64, per_replica=False)
    self._norm = state_variable(
        name + "/applied_gradient_norm", [], tf.float32, per_replica=False)
    self._max_skipped = max_skipped
    self._skipped_in_a_row = None
    if max_skipped is not None:
      self._skipped_in_a_row = state_variable(
          name + "/skipped_windows_in_a_row", [], tf.int64, per_replica=False,
          checkpointed=False)

  # Replica context: every micro-batch.

  def accumulate_micro_batch(self, loss=None):
    """Adds this micro-batch to the local window; returns a done tensor.

    With the micro-batch's `loss`, also warns when it is NaN: Estimator's
    NanTensorHook stops training on it before the window's end would say
    the window was skipped.

    The same ops run at every position of the window: no `tf.cond` decides
    whether to overwrite or add. The state is zeroed at the window's end
    instead (`_reset`), which keeps the graph, and the session's copies of
    it, smaller (measured: 8 MB less peak memory on BERT-Small), and never
    overwrites part of a window restored from a checkpoint.
    """
    weight = None
    if self._num_examples is not None:
      weight = tf.cast(self._num_examples, _COUNT_DTYPE)
    if self._reduction == "running_mean":
      updates = self._running_mean_updates(
          tf.constant(1.0, _COUNT_DTYPE) if weight is None else weight)
    else:
      updates = []
      if self._weight is not None:
        with self._after_the_gradients():
          updates.append(self._weight.assign_add(
              tf.constant(1.0, _COUNT_DTYPE) if weight is None else weight,
              read_value=False))
      scale = weight
      if self._divisor is not None:
        scale = tf.math.reciprocal(self._divisor.read_value())
      scale = self._in_accumulator_dtype(self._unscaled(scale))
      updates += [a.add(g, scale)
                  for a, g in zip(self._accumulators, self._gradients)]
    updates += [added for added in (s.added_on_this_replica()
                                    for s in self._statistics) if added]
    if loss is not None:
      updates.append(window_reports.warn_nan_loss(
          loss, self._position_counter.read_value()))
    with tf.control_dependencies(updates):
      return tf.constant(True, name="accumulated")

  def _running_mean_updates(self, weight):
    """Ops that keep the accumulators equal to the window's mean so far.

    mean_t = mean_{t-1} * (1 - f) + f * g_t, with f = w_t / W_t (the share of
    this micro-batch in the weight seen so far in the window: its examples,
    or 1 of its micro-batches).
    """
    with self._after_the_gradients():
      seen = self._weight.assign_add(weight)
    fraction = weight / seen
    with tf.control_dependencies([seen]):
      keep = self._in_accumulator_dtype(1.0 - fraction)
      decays = [a.decay(keep) for a in self._accumulators]
    with tf.control_dependencies(decays):
      fraction = self._in_accumulator_dtype(self._unscaled(fraction))
      return [a.add(g, fraction)
              for a, g in zip(self._accumulators, self._gradients)]

  def _after_the_gradients(self):
    """A scope whose ops wait for the micro-batch's gradients: a step whose
    input has ended (OutOfRangeError) still runs every op that does not
    need the input, and would count a micro-batch it never added."""
    return tf.control_dependencies(
        [getattr(g, "values", g) for g in self._gradients])

  def _unscaled(self, weight):
    """`weight` (None for 1) times 1/loss scale, when the loss is scaled: the
    gradients are unscaled in float32 as they enter the accumulators."""
    if self._loss_scaler is None:
      return weight
    inverse = tf.cast(self._loss_scaler.inverse(), _COUNT_DTYPE)
    return inverse if weight is None else weight * inverse

  def _in_accumulator_dtype(self, weight):
    """A float32 weight (or None) as the accumulators' dtype."""
    return None if weight is None else tf.cast(weight, self._dtype)

  # Cross-replica context: the end-of-micro-batch decision.

  def end_micro_batch(self, strategy, accumulated, examples=None):
    """merge_call body: maybe end the window, then count the micro-batch
    (and write the progress line when it is due). `examples`: the
    micro-batch's examples on each replica, when they can be told."""
    with tf.control_dependencies(strategy.experimental_local_results(
        accumulated)):
      position = tf.cast(self._position_counter.read_value(), tf.int64)
    ends_window = tf.equal(tf.math.floormod(position + 1, self._k), 0)
    status = tf.cond(
        ends_window,
        lambda: self._end_window(strategy, position),
        lambda: tf.constant(_STATUS_ACCUMULATED),
        name="end_of_window")
    if self._summaries:
      window_reports.add_summaries(status, self.state)
    with tf.control_dependencies([status]):
      counters = [self._global_step.assign_add(
          tf.constant(1, self._global_step.dtype.base_dtype),
          read_value=False)]
      if self._position_counter is not self._global_step:
        counters.append(self._position_counter.assign_add(
            tf.constant(1, tf.int64), read_value=False))
    if self._progress is not None:
      counters.append(self._progress_line(strategy, counters, position,
                                          examples))
    if self._after_update is None:
      return tf.group(*counters, name="train_op")
    with tf.control_dependencies(counters):
      after = tf.cond(tf.equal(status, _STATUS_APPLIED),
                      self._run_after_update, tf.no_op, name="after_update")
    return tf.group(*counters, after, name="train_op")

  def _progress_line(self, strategy, counters, position, examples):
    """The op writing the progress line, after the micro-batch's counters."""
    local = strategy.experimental_local_results(examples) if (
        examples is not None) else ()
    with tf.control_dependencies(counters):
      total = tf.constant(-1, tf.int64)
      if local:
        total = tf.add_n([tf.cast(e, tf.int64) for e in local])
      return self._progress.op(
          position + 1, self._updates.read_value(),
          self._skipped.read_value(), total, max(len(local), 1))

  def _run_after_update(self):
    """True branch: the user's `after_update` ops, once per applied update,
    after the micro-batch's work and counters (as a big-batch recipe's ops
    under `tf.control_dependencies([train_op])` run)."""
    with self._outer_name_scope(), tf.variable_creator_scope(
        create_outside_control_flow):
      created = self._after_update()
    created = [op for op in tf.nest.flatten(created) if op is not None]
    with tf.control_dependencies(created):
      return tf.no_op()

  def _end_window(self, strategy, position):
    """True branch: form, check and apply the window; reset it; count it."""
    local = strategy.extended.call_for_each_replica(self._local_window)
    if strategy.num_replicas_in_sync > 1:
      # The window's one all-reduce, made here in cross-replica context:
      # ReplicaContext.all_reduce wraps itself in tf.custom_gradient, which
      # looks variables up by op name and cannot find a replica's component
      # of an ON_READ accumulator.
      local = sum_over_replicas(strategy, local, self._communication_options)
    sums, rows, weight, statistics = local
    gradients, norm, finite, held = strategy.extended.call_for_each_replica(
        self._window_gradients, args=(sums, rows, weight))
    first = lambda value: strategy.experimental_local_results(value)[0]  # noqa: E731
    finite, norm = first(finite), first(norm)
    notes = []
    if self._counts_micro_batches:
      notes.append(window_reports.note_window_size(
          position, first(held), self._k, self._window_size))
    applied = tf.cond(
        finite,
        lambda: self._apply(strategy, gradients, statistics),
        lambda: window_reports.warn_skipped(position, norm))
    resets = strategy.extended.call_for_each_replica(
        self._reset, args=(applied,))
    with tf.control_dependencies(
        list(strategy.experimental_local_results(resets)) + notes):
      counters = [
          self._updates.assign_add(tf.cast(applied, tf.int64),
                                   read_value=False),
          self._skipped.assign_add(tf.cast(tf.logical_not(applied), tf.int64),
                                   read_value=False),
          self._norm.assign(norm, read_value=False),
      ]
      if self._loss_scaler is not None:
        counters.append(self._loss_scaler.update(finite))
      if self._skipped_in_a_row is not None:
        counters.append(self._check_divergence(applied, position))
      if self._divisor is not None:
        # The next window is added with this run's k * replicas.
        counters.append(self._divisor.assign(
            tf.constant(self._window_size, _COUNT_DTYPE), read_value=False))
    with tf.control_dependencies(counters):
      return tf.where(applied, _STATUS_APPLIED, _STATUS_SKIPPED)

  def _check_divergence(self, applied, position):
    """Counts the windows skipped in a row; fails the step (an
    InvalidArgumentError saying `training diverged`) when they reach
    max_consecutive_skipped_windows."""
    counter = self._skipped_in_a_row
    # Not initialized by any initializer (it is in no collection): the
    # first window starts it.
    before = tf.cond(counter.is_initialized(), counter.read_value,
                     lambda: tf.constant(0, tf.int64))
    in_a_row = counter.assign(tf.where(
        applied, tf.constant(0, tf.int64), before + 1))
    return tf.debugging.Assert(
        in_a_row < self._max_skipped,
        [window_reports.diverged_message(self._max_skipped), position],
        name="diverged")

  def _apply(self, strategy, gradients, statistics):
    moved = [s.move_averages(strategy, sums)
             for s, sums in zip(self._statistics, statistics)]
    with tf.control_dependencies(moved), self._outer_name_scope():
      return self._apply_gradients(strategy, gradients)

  def _apply_gradients(self, strategy, gradients):
    if (strategy.num_replicas_in_sync > 1 and
        reduces_in_distributed_apply(self._optimizer)):
      # A v1 optimizer would all-reduce the gradients again (a second round
      # of collectives per window, for nothing): run its cross-replica apply
      # with that reduction taken out; the gradients already are the mean.
      variables = [a.variable for a in self._accumulators]
      with tf.variable_creator_scope(create_outside_control_flow):
        apply_op = self._optimizer._distributed_apply(  # noqa: SLF001
            AlreadyReduced(strategy), list(zip(gradients, variables)))
      with tf.control_dependencies([apply_op]):
        return tf.constant(True)
    with reduction_taken_out(self._optimizer):
      applied = strategy.extended.call_for_each_replica(
          self._apply_on_replica, args=(gradients,))
    with tf.control_dependencies(strategy.experimental_local_results(applied)):
      return tf.constant(True)

  def _outer_name_scope(self):
    """Enters, inside a branch, the name scope the train op was built in.

    The optimizer (or after_update) builds its ops there and creates its
    slots and step counts (`init_scope` keeps the name scope it is entered
    from) under the names plain `minimize` gives them: `beta1_power`,
    `Adam/iter`. Left in the branch's scope they would be named
    `gradient_accumulation/end_of_window/cond/beta1_power` under control
    flow v1, and lose the caller's scope under v2 (a branch's graph starts
    at the root): checkpoints would differ with the control flow version
    and from plain training's.
    """
    scope = self._outer_scope
    return tf.compat.v1.get_default_graph().name_scope(
        scope + "/" if scope else "")

  # Replica context, inside the end-of-window branch.

  def _local_window(self):
    """This replica's window before any communication: (sums, rows, weight,
    statistics), the last the sums of each batch_norm layer's window.

    `sums` holds one tensor per variable, summed over the replica's
    micro-batches (weighted by their sizes with num_examples; for the plain
    mean, divided by the window's divisor as they were added); `weight` is
    the replica's share of what the mean divides by: its examples or its
    micro-batches (None for the sum). For the running mean, whose
    accumulators hold a mean, the sums are rebuilt as mean * weight so
    replicas combine as for the other reductions.

    On one replica a sparse variable's sum is already a tf.IndexedSlices and
    `rows` holds None. With several replicas the dense sum and its touched-row
    mask are returned instead, so that the all-reduce has the same shapes on
    every replica (IndexedSlices are all-gathered, and their row counts
    differ); `_window_gradients` rebuilds the IndexedSlices afterwards.
    """
    several = tf.distribute.get_strategy().num_replicas_in_sync > 1
    sums, rows = [], []
    for accumulator in self._accumulators:
      if accumulator.is_sparse and several:
        sums.append(accumulator.total.read_value())
        rows.append(accumulator.rows.read_value())
      else:
        sums.append(accumulator.window_sum())
        rows.append(None)
    weight = None
    if self._weight is not None:
      weight = self._weight.read_value()
    if self._reduction == "running_mean":
      sums = [scale_gradient(s, tf.cast(weight, self._dtype)) for s in sums]
    return sums, rows, weight, [s.local_sums() for s in self._statistics]

  def _window_gradients(self, sums, rows, weight):
    """The window's gradient on this replica, from sums over all replicas.

    Returns:
      (gradients, norm, finite, weight): the list of window gradients
      (tf.Tensor or tf.IndexedSlices with unique rows, the variables' dtypes,
      clipped if asked), their global norm before clipping (float32), whether
      that norm is finite, and the window's weight over all replicas (None
      for the sum). A NaN or Inf anywhere in the window makes the norm
      non-finite, and every replica sees the same reduced values.
    """
    sums = [cast_gradient(s if r is None else rows_to_slices(s, r), tf.float32)
            for s, r in zip(sums, rows)]
    # The mean's sums are the window's gradient times `factor`, which is 1
    # except in a window that straddles a resume with another k or number
    # of replicas.
    factor = None
    if self._reduction == "sum":
      gradients = sums
    elif self._divisor is not None:
      gradients = sums
      factor = self._divisor.read_value() / weight
    else:
      gradients = [scale_gradient(s, 1.0 / weight) for s in sums]
    norm = tf.linalg.global_norm(gradients)
    if factor is not None:
      norm *= factor
    finite = tf.math.is_finite(norm)
    if self._clip_norm is not None:
      # tf.clip_by_global_norm's scale, times the factor: one product per
      # gradient, which clipping makes anyway.
      clip_norm = tf.constant(self._clip_norm, norm.dtype)
      scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
      if factor is not None:
        scale *= factor
      gradients = [scale_gradient(g, scale) for g in gradients]
    elif factor is not None:
      gradients = scale_unless_one(factor, gradients)
    gradients = [cast_gradient(g, a.variable.dtype.base_dtype)
                 for g, a in zip(gradients, self._accumulators)]
    return gradients, norm, finite, weight

  def _apply_on_replica(self, gradients):
    """Hands the window's gradient to the optimizer on this replica."""
    variables = [a.variable for a in self._accumulators]
    extra = {}
    if isinstance(self._optimizer, tf.keras.optimizers.legacy.Optimizer):
      # Already reduced: tell Keras not to reduce again.
      extra = dict(experimental_aggregate_gradients=False)
    # A v1 optimizer is given the whole mean too: reduction_taken_out.
    with tf.variable_creator_scope(create_outside_control_flow):
      apply_op = self._optimizer.apply_gradients(
          list(zip(gradients, variables)), **extra)
    with tf.control_dependencies([apply_op]):
      return tf.constant(True)

  def _reset(self, after):
    with tf.control_dependencies([after]):
      resets = [a.reset() for a in self._accumulators]
      resets += [s.reset() for s in self._statistics]
      if self._weight is not None:
        resets.append(self._weight.assign(
            tf.zeros([], _COUNT_DTYPE), read_value=False))
    with tf.control_dependencies(resets):
      return tf.constant(True)
