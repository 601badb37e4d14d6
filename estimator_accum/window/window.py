"""The graph of one accumulation window (internal to estimator_accum).

`Window` puts together, for one call of `build_accumulating_train_op`, the
four parts that its `plan.WindowPlan` drives, each with one job:

- `accumulate.Accumulation`: the window's sums, each micro-batch added on
  its own replica;
- `communication.Communication`: what crosses replicas, at the window's
  end (and per micro-batch for a sharded window);
- `finish.Finish`: the window's gradient formed, checked, clipped and
  applied;
- `bookkeeping.Bookkeeping`: the position, the counters, the progress line.

The window's own code is the path of one micro-batch through them: added
(replica context), then the end-of-micro-batch decision (cross-replica
context, inside `merge`): at a window's end, all-reduce, check, apply,
reset and count; always, count the micro-batch.
"""

import tensorflow as tf

from estimator_accum.window import reports, window_copies
from estimator_accum.window.accumulate import Accumulation
from estimator_accum.window.bookkeeping import Bookkeeping
from estimator_accum.window.communication import Communication
from estimator_accum.window.finish import Finish

_STATUS_ACCUMULATED = 0
_STATUS_APPLIED = 1
_STATUS_SKIPPED = 2


def _token(ops, name=None):
  """A bool tensor that exists once `ops` have run."""
  with tf.control_dependencies(ops):
    return tf.constant(True, name=name)


class Window:
  """Builds the graph of one accumulation window from its plan."""

  def __init__(self, plan, trained, optimizer, global_step, loss_scaler=None,
               progress=None):
    """Args: the build's `WindowPlan`, the micro-batch's [(gradient,
    variable)], the optimizer, the micro-batch counter, the `LossScaler` or
    None, and the graph's ProgressLine or None."""
    self._plan = plan
    self._gradients = [g for g, _ in trained]
    self._loss_scaler = loss_scaler
    self._sums = Accumulation(plan, trained)
    self._communication = Communication(plan, self._sums)
    self._finish = Finish(plan, optimizer, self._sums.accumulators)
    self._books = Bookkeeping(plan, global_step, loss_scaler, progress,
                              self._sums.accumulators)
    self.state = self._books.state

  def state_variables(self):
    """{name: variable} of the window's saved state, in the order made:
    the loss scale, the accumulators, the reduction's weight, the local
    position and the counters; and {name: (trained variable's name, slot
    name)} for the state that is one trained variable's, which object-based
    checkpoints key as that variable's slot "window_<suffix>"."""
    sums, slots = self._sums.state_variables()
    made = (self._loss_scaler.state_variables() if self._loss_scaler else [])
    made += sums + self._books.state_variables()
    return {v.name.split(":")[0]: v for v in made}, slots

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
    instead (`Accumulation.reset`), which keeps the graph, and the
    session's copies of it, smaller (measured: 8 MB less peak memory on
    BERT-Small), and never overwrites part of a window restored from a
    checkpoint.

    Returns:
      (done, added): bool tensors, `done` once every op of the micro-batch
      has run, `added[i]` once accumulator i holds the micro-batch. The
      window's end reads each accumulator after its own tensor only, so
      that its all-reduce starts while the backward pass still computes
      the gradients of the layers below.
    """
    gradients = self._communication.micro_batch(self._gradients)
    added, own = self._sums.add(gradients, self._loss_scaler)
    if loss is not None:
      own.append(reports.warn_nan_loss(
          loss, self._books.position.read_value()))
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
    and each of its reads waits for what it reads (`accumulate.after`):
    for an accumulator, its adds on every replica of this worker (a
    strategy may keep one accumulator for all of them, as
    CentralStorageStrategy does)."""
    settings = self._plan.settings
    done = _token(cross_replica.local(accumulated[0]))
    added = ([_token(cross_replica.local(t)) for t in accumulated[1]]
             if settings.overlap_backward else [done] * len(accumulated[1]))
    position = tf.cast(self._books.position.read_value(), tf.int64)
    ends_window = tf.equal(tf.math.floormod(position + 1, settings.k), 0)
    status = tf.cond(
        ends_window,
        lambda: self._end_window(cross_replica, position, (done, added)),
        lambda: tf.constant(_STATUS_ACCUMULATED),
        name="end_of_window")
    counters = self._books.count_micro_batch(cross_replica, status, done,
                                             position, examples)
    if (settings.after_update is None and
        not window_copies.claimed(settings.name)):
      return tf.group(*counters, name="train_op")
    with tf.control_dependencies(counters):
      after = tf.cond(tf.equal(status, _STATUS_APPLIED), self._after_update,
                      tf.no_op, name="after_update")
    return tf.group(*counters, after, name="train_op")

  def _after_update(self):
    """True branch: the train op's copies remade from the updated
    variables (`cast_once_per_window`), and the user's `after_update`."""
    settings = self._plan.settings
    created = window_copies.remade(settings.name)
    if settings.after_update is not None:
      created.append(self._finish.after_update())
    with tf.control_dependencies(created):
      return tf.no_op()

  def _end_window(self, cross_replica, position, accumulated):
    """True branch: form, check and apply the window; reset it; count it."""
    sums, rows, weight, statistics = self._communication.all_reduce(
        cross_replica, accumulated)
    gradients, norm, finite, held, scale = cross_replica.each(
        self._finish.window_gradients, sums, rows, weight)
    finite, norm = cross_replica.first(finite), cross_replica.first(norm)
    notes = []
    if self._plan.reduction.counts_micro_batches:
      notes.append(reports.note_window_size(
          position, cross_replica.first(held), self._plan.k,
          self._plan.window_size))
    applied = tf.cond(
        finite,
        lambda: self._apply(cross_replica, gradients, scale, statistics),
        lambda: reports.warn_skipped(position, norm))
    resets = cross_replica.each(self._sums.reset, applied)
    with tf.control_dependencies(list(cross_replica.local(resets)) + notes):
      bookkeeping = self._books.count_window(applied, finite, norm, position)
    with tf.control_dependencies(bookkeeping):
      return tf.where(applied, _STATUS_APPLIED, _STATUS_SKIPPED)

  def _apply(self, cross_replica, gradients, scale, statistics):
    """The finite window's branch: the batch_norm layers' moving
    statistics, then the optimizer's update."""
    moved = [s.move_averages(cross_replica, sums)
             for s, sums in zip(self._sums.statistics, statistics)]
    return self._finish.apply(cross_replica, gradients, scale, moved)
