"""The graph of one accumulation window (internal to estimator_accum).

`Window` builds, for one call of `build_accumulating_train_op`: the state
(accumulators, the reduction's weight, the counters), the per-micro-batch
accumulate ops (replica context), and the end-of-micro-batch decision
(cross-replica context, inside `merge`): form the window's gradient,
all-reduce it once, check it, clip it, apply it, reset, and count it.

What the window needs of `tf.distribute` it asks `distribution` for; how
its micro-batches combine it leaves to its `reductions.Reduction`.
"""

import contextlib

import tensorflow as tf

from estimator_accum.checkpoints.state_variables import (
  state_variable,
  variable_base_name,
)
from estimator_accum.distribution import apply, replicas
from estimator_accum.window import (
  apply_order,
  communication,
  reductions,
  reports,
  sharded,
)
from estimator_accum.window.accumulators import (
  Accumulator,
  rows_to_slices,
  touched_rows,
)
from estimator_accum.window.batch_norm import claim_window_statistics
from estimator_accum.window.compact import CompactSparseAccumulator
from estimator_accum.window.counters import WindowCounters
from estimator_accum.window.gradient_ops import (
  cast_gradient,
  scale_gradient,
  scale_unless_one,
)
from estimator_accum.window.state import AccumulationState

_STATUS_ACCUMULATED = 0
_STATUS_APPLIED = 1
_STATUS_SKIPPED = 2


def _token(ops, name=None):
  """A bool tensor that exists once `ops` have run."""
  with tf.control_dependencies(ops):
    return tf.constant(True, name=name)


def _after(token):
  """A scope whose ops wait for `token`, taken in as data. Inside the
  window's tf.cond a data input reaches only the ops that use it, where a
  control input from outside the branch would hold back the whole branch
  (under control flow v2 it becomes a control input of the cond itself)."""
  return tf.control_dependencies([tf.identity(token)])


def _placement(placement, local_device):
  """Where the accumulators are made, and so where their adds run (resource
  ops run on their variable's device): beside the variables, or in the
  host's memory."""
  if placement in ("device", "sharded"):
    return contextlib.nullcontext()
  if replicas.num_replicas() > 1 or local_device is not None:
    raise ValueError(
        "accumulator_placement='host' keeps one replica's window in host "
        f"memory; this train op has {replicas.num_replicas()} replicas"
        f"{' on a parameter-server worker' if local_device else ''}. Use "
        "'device'.")
  return tf.device("/device:CPU:0")


class _Unscaling:
  """A float32 weight (None for 1) divided by the loss scale, when the loss
  is scaled, as the accumulators' dtype: the gradients are unscaled in
  float32 as they enter the accumulators."""

  def __init__(self, loss_scaler, dtype):
    self._loss_scaler = loss_scaler
    self._dtype = dtype

  def __call__(self, weight):
    if self._loss_scaler is not None and self._loss_scaler.unscales:
      inverse = tf.cast(self._loss_scaler.inverse(), reductions.COUNT_DTYPE)
      weight = inverse if weight is None else weight * inverse
    return self.in_accumulator_dtype(weight)

  def in_accumulator_dtype(self, weight):
    return None if weight is None else tf.cast(weight, self._dtype)


class Window:
  """Builds the graph of one accumulation window."""

  def __init__(self, trained, optimizer, settings, global_step, reduction,
               loss_scaler=None, local_device=None, compact=None,
               outer_scope="", progress=None):
    """Args: the micro-batch's [(gradient, variable)], the optimizer, the
    `WindowSettings`, the micro-batch counter, the `reductions.Reduction`
    the options chose, the `LossScaler` or None, the worker's device in
    between-graph training or None, which variables accumulate compactly,
    the name scope the train op is built in, and the graph's ProgressLine
    or None."""
    self._settings = settings
    self._optimizer = optimizer
    self._global_step = global_step
    self._gradients = [g for g, _ in trained]
    self._loss_scaler = loss_scaler
    # The name scope the train op is built in: see _outer_name_scope.
    self._outer_scope = outer_scope
    self._progress = progress
    self._window_size = settings.k * replicas.num_replicas()
    # The batch_norm layers whose moving statistics this window updates.
    self._statistics = claim_window_statistics(settings.k, settings.name)
    self._reduction = reduction
    compact = compact or [False] * len(trained)
    self._sharded = settings.accumulator_placement == "sharded"
    if self._sharded:
      sharded.check(replicas.num_replicas(), reduction, local_device)
    with _placement(settings.accumulator_placement, local_device):
      # Made in this order, which the Keras wrapper's weights follow.
      self._accumulators = [
          self._accumulator(g, v, c, local_device)
          for (g, v), c in zip(trained, compact)]
    self._reduction.build(settings.name, self._window_size, local_device)
    # The dtype the window's sums cross replicas in (None: as they are);
    # cast back to float32 by _window_gradients.
    self._wire = (settings.communication_dtype
                  if replicas.num_replicas() > 1 else None)
    # The tables that cross replicas by their touched rows: the rows of the
    # block each is sent in, or None (communication.py).
    self._by_rows = [
        communication.rows_block(a, g, settings.table_all_reduce,
                                 replicas.num_replicas(), settings.k)
        for a, g in zip(self._accumulators, self._gradients)]
    # The order the window's sums are sent in: the backward pass's.
    self._ready_order = communication.ready_order(self._gradients)
    # The window's position: the global step, except in between-graph
    # training, where the global step is shared by workers that each keep
    # their own window and count their own micro-batches.
    self._position = global_step
    if local_device is not None:
      self._position = state_variable(
          settings.name + "/local_micro_batches", [], tf.int64,
          per_replica=True, local_device=local_device)
    self._counters = WindowCounters(
        settings.name, settings.max_consecutive_skipped_windows)
    self.state = AccumulationState(
        settings.k, global_step, self._counters.updates_applied,
        self._counters.skipped_windows, self._counters.applied_gradient_norm,
        self._accumulators, loss_scaler.scale if loss_scaler else None)

  def _accumulator(self, gradient, variable, compact, local_device):
    dtype = self._settings.accumulator_dtype
    if compact:
      return CompactSparseAccumulator(variable, dtype, local_device)
    if self._sharded and not isinstance(gradient, tf.IndexedSlices):
      return sharded.ShardedAccumulator(variable, dtype,
                                        replicas.num_replicas())
    return Accumulator(variable, gradient, dtype, local_device,
                       holds_mean=self._reduction.holds_mean)

  def state_variables(self):
    """{name: variable} of the window's saved state, in the order made:
    the loss scale, the accumulators, the reduction's weight, the local
    position and the counters; and {name: (trained variable's name, slot
    name)} for the state that is one trained variable's, which object-based
    checkpoints key as that variable's slot "window_<suffix>"."""
    slots = {}
    for accumulator in self._accumulators:
      base = variable_base_name(accumulator.variable)
      for variable in accumulator.state_variables():
        name = variable_base_name(variable)
        slots[name] = (base, "window_" + name[len(base) + 1:])
    made = (self._loss_scaler.state_variables() if self._loss_scaler else [])
    made += [v for a in self._accumulators for v in a.state_variables()]
    made += self._reduction.state_variables()
    if self._position is not self._global_step:
      made.append(self._position)
    made += self._counters.state_variables()
    return {variable_base_name(v): v for v in made}, slots

  # Replica context: every micro-batch.

  def accumulate_micro_batch(self, loss=None):
    """Adds this micro-batch to the local window.

    With the micro-batch's `loss`, also warns when it is NaN: Estimator's
    NanTensorHook stops training on it before the window's end would say
    the window was skipped (unless Estimator is given
    `reportable_loss(loss)`, built before the train op: then the train op
    is given no loss, and the window's end says it all in one line).

    The same ops run at every position of the window: no `tf.cond` decides
    whether to overwrite or add. The state is zeroed at the window's end
    instead (`_reset`), which keeps the graph, and the session's copies of
    it, smaller (measured: 8 MB less peak memory on BERT-Small), and never
    overwrites part of a window restored from a checkpoint.

    Returns:
      (done, added): bool tensors, `done` once every op of the micro-batch
      has run, `added[i]` once accumulator i holds the micro-batch. The
      window's end reads each accumulator after its own tensor only, so
      that its all-reduce starts while the backward pass still computes
      the gradients of the layers below.
    """
    gradients = self._gradients
    if self._sharded:
      gradients = sharded.micro_batch_slices(
          self._accumulators, gradients,
          self._settings.communication_options)
    added, own = self._reduction.add(
        self._accumulators, gradients,
        _Unscaling(self._loss_scaler, self._settings.accumulator_dtype))
    own += [op for op in (s.added_on_this_replica()
                          for s in self._statistics) if op]
    if loss is not None:
      own.append(reports.warn_nan_loss(loss, self._position.read_value()))
    done = _token(added + own, name="accumulated")
    return done, [_token([op]) for op in added]

  # Cross-replica context: the end-of-micro-batch decision.

  def end_micro_batch(self, cross_replica, accumulated, examples=None):
    """`replicas.merge` body: maybe end the window, then count the
    micro-batch (and write the progress line when it is due).
    `accumulated`: what `accumulate_micro_batch` returned, per replica;
    `examples`: the micro-batch's examples on each replica, when they can
    be told.

    The decision reads the position only, which no op of this micro-batch
    changes before the counters: the window's end starts with the step,
    and each of its reads waits for what it reads (`_after`): for an
    accumulator, its adds on every replica of this worker (a strategy may
    keep one accumulator for all of them, as CentralStorageStrategy
    does)."""
    done = _token(cross_replica.local(accumulated[0]))
    added = ([_token(cross_replica.local(t)) for t in accumulated[1]]
             if self._settings.overlap_backward else
             [done] * len(accumulated[1]))
    position = tf.cast(self._position.read_value(), tf.int64)
    ends_window = tf.equal(tf.math.floormod(position + 1, self._settings.k), 0)
    status = tf.cond(
        ends_window,
        lambda: self._end_window(cross_replica, position, (done, added)),
        lambda: tf.constant(_STATUS_ACCUMULATED),
        name="end_of_window")
    if self._settings.summaries:
      reports.add_summaries(status, self.state)
    with tf.control_dependencies([status, done]):
      counters = [self._global_step.assign_add(
          tf.constant(1, self._global_step.dtype.base_dtype),
          read_value=False)]
      if self._sharded:
        counters.append(sharded.resumed_mid_window_check(
            self._settings.name, position, self._settings.k))
      if self._position is not self._global_step:
        counters.append(self._position.assign_add(
            tf.constant(1, tf.int64), read_value=False))
    if self._progress is not None:
      counters.append(self._progress_line(cross_replica, counters, position,
                                          examples))
    if self._settings.after_update is None:
      return tf.group(*counters, name="train_op")
    with tf.control_dependencies(counters):
      after = tf.cond(tf.equal(status, _STATUS_APPLIED),
                      self._run_after_update, tf.no_op, name="after_update")
    return tf.group(*counters, after, name="train_op")

  def _progress_line(self, cross_replica, counters, position, examples):
    """The op writing the progress line, after the micro-batch's counters."""
    local = cross_replica.local(examples) if examples is not None else ()
    with tf.control_dependencies(counters):
      total = tf.constant(-1, tf.int64)
      if local:
        total = tf.add_n([tf.cast(e, tf.int64) for e in local])
      return self._progress.op(
          position + 1, self.state.updates_applied.read_value(),
          self.state.skipped_windows.read_value(), total, max(len(local), 1))

  def _run_after_update(self):
    """True branch: the user's `after_update` ops, once per applied update,
    after the micro-batch's work and counters (as a big-batch recipe's ops
    under `tf.control_dependencies([train_op])` run)."""
    with self._outer_name_scope(), tf.variable_creator_scope(
        apply.create_outside_control_flow):
      created = self._settings.after_update()
    created = [op for op in tf.nest.flatten(created) if op is not None]
    with tf.control_dependencies(created):
      return tf.no_op()

  def _end_window(self, cross_replica, position, accumulated):
    """True branch: form, check and apply the window; reset it; count it.

    The window's one all-reduce is made here in cross-replica context:
    ReplicaContext.all_reduce wraps itself in tf.custom_gradient, which
    looks variables up by op name and cannot find a replica's component of
    an ON_READ accumulator.
    """
    sums, rows, weight, statistics = self._all_reduce(cross_replica,
                                                      accumulated)
    gradients, norm, finite, held, scale = cross_replica.each(
        self._window_gradients, sums, rows, weight)
    finite, norm = cross_replica.first(finite), cross_replica.first(norm)
    notes = []
    if self._reduction.counts_micro_batches:
      notes.append(reports.note_window_size(
          position, cross_replica.first(held), self._settings.k,
          self._window_size))
    applied = tf.cond(
        finite,
        lambda: self._apply(cross_replica, gradients, scale, statistics),
        lambda: reports.warn_skipped(position, norm))
    resets = cross_replica.each(self._reset, applied)
    with tf.control_dependencies(list(cross_replica.local(resets)) + notes):
      bookkeeping = self._counters.count(applied, norm, position)
      if self._loss_scaler is not None:
        bookkeeping.append(self._loss_scaler.update(finite))
      bookkeeping += self._reduction.after_window()
    with tf.control_dependencies(bookkeeping):
      return tf.where(applied, _STATUS_APPLIED, _STATUS_SKIPPED)

  def _all_reduce(self, cross_replica, accumulated):
    """The window's sums over every replica: (sums, rows, weight,
    statistics), per replica. A table sent by its rows comes back as its
    touched rows' sums, its `rows` entry the union of the rows touched
    (int64 indices, the same on every replica); a masked table sent whole,
    as its dense sum and its summed row mask.

    The sums travel in packs, in the order the backward pass makes their
    gradients (`communication.ready_order`), the window's weight and
    statistics last: each pack starts once its own accumulators hold the
    last micro-batch, while the backward pass goes on below.
    """
    options = self._settings.communication_options
    sums, rows, weight, statistics = cross_replica.each(
        self._local_window, *accumulated)
    summed = [i for i in self._ready_order
              if self._accumulators[i].kind != "sharded"]
    pairs, weight, statistics = communication.sum_in_packs(
        cross_replica, ([(sums[i], rows[i]) for i in summed],
                        weight, statistics), options)
    for i, (total, mask) in zip(summed, pairs):
      sums[i], rows[i] = total, mask
    if self._sharded:
      # Each replica's slice, gathered: the window's sum, with no tensor of
      # the variable's size on any replica before it.
      for i, accumulator in enumerate(self._accumulators):
        if accumulator.kind == "sharded":
          sums[i] = accumulator.joined(cross_replica.gather(sums[i]))
    if not any(self._by_rows):
      return sums, rows, weight, statistics
    # The rows touched on any replica: the summed masks are the same on
    # every replica.
    union = {i: touched_rows(cross_replica.first(rows[i]))
             for i, block in enumerate(self._by_rows) if block}
    touched = cross_replica.sum(
        cross_replica.each(self._touched_rows, union, accumulated[0]),
        replicas.one_pack(options))
    for position, i in enumerate(sorted(union)):
      sums[i], rows[i] = touched[position], union[i]
    return sums, rows, weight, statistics

  def _touched_rows(self, union, done):
    """Replica context: this replica's sums of the rows in `union` ({table
    index: int64 rows}), as the reduction's `local` forms sums, once the
    micro-batch is `done`."""
    with _after(done):
      gathered = [self._accumulators[i].rows_of(union[i])
                  for i in sorted(union)]
      gathered, _ = self._reduction.local(gathered)
    gathered = [communication.in_block(g, self._by_rows[i])
                for g, i in zip(gathered, sorted(union))]
    return communication.to_wire(gathered, self._wire)

  def _apply(self, cross_replica, gradients, scale, statistics):
    moved = [s.move_averages(cross_replica, sums)
             for s, sums in zip(self._statistics, statistics)]
    gates = []
    gradients = cross_replica.each(self._ready_to_apply, gradients, scale,
                                   gates)
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    with tf.control_dependencies(moved), self._outer_name_scope():
      applied = apply.apply_reduced(
          cross_replica, self._optimizer, gradients,
          [a.variable for a in self._accumulators])
    made = set(graph.get_operations()[before:])
    for replica_gates in gates:
      apply_order.chain(replica_gates, made)
    return applied

  def _ready_to_apply(self, gradients, scale, gates):
    """Replica context, in the apply's branch: the window's gradients as the
    optimizer takes them, times `scale` (clipping and the reduction's
    factor; None for 1), in the variables' dtypes. With sequential_apply
    each passes a gate first (appended to `gates`), so that its product
    and the optimizer's temporaries are made one variable at a time."""
    if self._settings.sequential_apply:
      gated = [apply_order.gate(g) for g in gradients]
      gradients = [g for g, _ in gated]
      gates.append([op for _, op in gated])
    if scale is not None:
      if self._settings.clip_norm is None and (
          not self._settings.sequential_apply):
        # Mostly 1: no product, and no copy of the model, then.
        gradients = scale_unless_one(scale, gradients)
      else:
        gradients = [scale_gradient(g, scale) for g in gradients]
    return [cast_gradient(g, a.variable.dtype.base_dtype)
            for g, a in zip(gradients, self._accumulators)]

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

  def _local_window(self, done, added):
    """This replica's window before any communication: (sums, rows, weight,
    statistics), the last the sums of each batch_norm layer's window.

    `sums` holds one tensor per variable, as the reduction's `local` gives
    them; `weight` is the replica's share of what the mean divides by (None
    for the sum). A table's sum on one replica is a tf.IndexedSlices and
    `rows` holds None; with several replicas it is the dense sum and its
    touched-row mask, so that the all-reduce has the same shapes on every
    replica (IndexedSlices are all-gathered, and their row counts differ);
    `_window_gradients` rebuilds the IndexedSlices afterwards.

    Each accumulator is read once it holds the micro-batch (`added`, a
    bool tensor per accumulator), the rest once the micro-batch is `done`.
    """
    several = replicas.num_replicas() > 1
    sums, rows = [], []
    for accumulator, block, token in zip(self._accumulators, self._by_rows,
                                         added):
      with _after(token):
        # A table sent by its rows sends only its mask in this round: its
        # dense sum is not read (a read of a table that scatter ops update
        # copies it).
        total, mask = ((None, accumulator.rows.read_value()) if block
                       else accumulator.reducible_sum(several))
      sums.append(total)
      rows.append(mask)
    with _after(done):
      local, weight = self._reduction.local([s for s in sums if s is not None])
      statistics = [s.local_sums() for s in self._statistics]
    local = iter(local)
    sums = [None if s is None else next(local) for s in sums]
    sums = communication.to_wire(sums, self._wire)
    return sums, rows, weight, statistics

  def _window_gradients(self, sums, rows, weight):
    """The window's gradient on this replica, from sums over all replicas.

    Returns:
      (gradients, norm, finite, weight, scale): the list of window
      gradients (float32 tf.Tensor or tf.IndexedSlices with unique rows),
      their global norm before clipping (float32), whether that norm is
      finite, the window's weight over all replicas (None for the sum), and
      the scalar the gradients are to be multiplied by (clipping and the
      reduction's factor; None for 1), which `_ready_to_apply` applies in
      the apply's branch. A NaN or Inf anywhere in the window makes the
      norm non-finite, and every replica sees the same reduced values.
    """
    sums = [cast_gradient(self._as_gradient(s, r, a), tf.float32)
            for s, r, a in zip(sums, rows, self._accumulators)]
    gradients, factor = self._reduction.finish(sums, weight)
    norm = tf.linalg.global_norm(gradients)
    if factor is not None:
      norm *= factor
    finite = tf.math.is_finite(norm)
    clip_norm = self._settings.clip_norm
    scale = factor
    if clip_norm is not None:
      # tf.clip_by_global_norm's scale, times the factor: one product per
      # gradient, which clipping makes anyway.
      clip_norm = tf.constant(clip_norm, norm.dtype)
      scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
      if factor is not None:
        scale *= factor
    return gradients, norm, finite, weight, scale

  @staticmethod
  def _as_gradient(total, rows, accumulator):
    """A window sum as its variable's gradient: as it is; a dense table's
    sum by its row mask (float32 [rows]); or a block whose first rows are
    the sums of a table's touched rows, by their indices (int64 [rows
    touched])."""
    if rows is None:
      return total
    if rows.dtype == tf.int64:
      return tf.IndexedSlices(total[:tf.shape(rows)[0]], rows, tf.constant(
          accumulator.variable.shape.as_list(), tf.int64))
    return rows_to_slices(total, rows)

  def _reset(self, after):
    with tf.control_dependencies([after]):
      resets = []
      for accumulator in self._accumulators:
        # With sequential_apply, one after the other too: each reset makes
        # zeros the size of its accumulator.
        with tf.control_dependencies(
            resets[-1:] if self._settings.sequential_apply else []):
          resets.append(accumulator.reset())
      resets += [s.reset() for s in self._statistics]
      resets += self._reduction.reset()
    with tf.control_dependencies(resets):
      return tf.constant(True)
