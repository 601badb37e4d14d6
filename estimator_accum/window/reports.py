"""What a window tells the user: TensorBoard scalars, the warnings printed
from the graph when a window is skipped or holds other than k micro-batches
per replica (internal), and `reportable_loss`, the loss to give Estimator
so that a skipped window does not stop training (public).

Warnings are printed by the graph itself, to stderr: they happen inside a
`tf.cond` at run time, and TensorFlow's C++ log (tf.print's logging streams)
is often silenced by TF_CPP_MIN_LOG_LEVEL.
"""

import sys

import tensorflow as tf

from estimator_accum import _checks, graph_state, releases
from estimator_accum._autograph import as_written
from estimator_accum.checkpoints.state_variables import state_variable
from estimator_accum.distribution import workers
from estimator_accum.distribution.placement import between_graph_worker_device


def add_summaries(after, state):
  """TensorBoard scalars: updates, skipped windows, applied gradient norm.

  Built once, in cross-replica context (in a tf.function, TensorFlow 2's
  summaries: written where a default writer records, as Keras's TensorBoard
  callback sets one). The values are read after `after`
  (the micro-batch's work), so the scalar at step s is the state after
  micro-batch s; a plain read of the variables would race with the cond.
  Fetching them runs that micro-batch, which is what Estimator's
  SummarySaverHook does. Tagged `accumulation/*`: a tag equal to a counter's
  own op name would be uniquified into `..._1`.

  Args:
    after: a tensor the reads wait for (the micro-batch's status).
    state: the window's `AccumulationState`.
  """
  with tf.control_dependencies([after]):
    values = {"updates_applied": state.updates_applied.read_value(),
              "skipped_windows": state.skipped_windows.read_value(),
              "applied_gradient_norm": state.applied_gradient_norm.read_value()}
    if state.loss_scale is not None:
      values["loss_scale"] = state.loss_scale.read_value()
  in_function = tf.compat.v1.get_default_graph().building_function
  with tf.compat.v1.name_scope(None):
    for tag, value in values.items():
      if in_function:
        # TensorFlow 2: written where a default writer records (Keras's
        # TensorBoard callback sets one, and the step), else nothing.
        releases.summary_scalar("accumulation/" + tag, value)
      else:
        tf.compat.v1.summary.scalar("accumulation/" + tag, value)


def warn_skipped(position, norm):
  """Prints that the window ending at `position` was skipped; returns a
  False tensor (the window was not applied) after the print."""
  warn = tf.print(
      "WARNING estimator_accum: skipped the window ending at micro-batch",
      position, "because its gradient is not finite (global norm", norm, ")",
      output_stream=sys.stderr)
  with tf.control_dependencies([warn]):
    return tf.constant(False)


# Every error that stops a diverged run says this; `is_divergence` looks for
# it in the error TensorFlow raises.
DIVERGED = "training diverged"


def diverged_message(max_skipped):
  """The text of the error stopping a run whose windows were skipped
  `max_skipped` times in a row; the micro-batch follows it."""
  return (f"estimator_accum: {DIVERGED}: {max_skipped} windows in a row were "
          "skipped for non-finite gradients (NaN/Inf); lower the learning "
          "rate, clip (clip_norm), or raise max_consecutive_skipped_windows "
          "(None never stops). The last skipped window ended at micro-batch")


def is_divergence(error):
  """Whether `error` (an exception from a train op's run) is the stop of a
  run whose windows were skipped too many times in a row."""
  return isinstance(error, tf.errors.InvalidArgumentError) and (
      DIVERGED in str(error))


def is_reported(loss):
  """Whether `reportable_loss` was given `loss` (a tensor of this graph):
  Estimator then trains on past its NaN micro-batches, and the window's
  skip line says all there is to say."""
  return loss.name in graph_state.owned("reported_losses", set)


def warn_nan_loss(loss, position):
  """An op printing, when the micro-batch's `loss` is NaN, that its window
  will be skipped, and how to keep Estimator training: its NanTensorHook
  raises NanLossDuringTrainingError after this micro-batch, before the
  window's end could report the skip, unless given `reportable_loss`.

  Args:
    loss: scalar floating tf.Tensor, the micro-batch loss.
    position: int64 scalar tensor, the micro-batch's position (0-based).

  Returns:
    A tf.Operation.
  """

  def warn():
    return tf.print(
        "WARNING estimator_accum: the loss of micro-batch", position,
        "is NaN; its window will be skipped. If Estimator stops here with "
        "NanLossDuringTrainingError, give its EstimatorSpec "
        "loss=estimator_accum.reportable_loss(loss), which reports the last "
        "finite loss instead.",
        output_stream=sys.stderr)

  # reduce_any: a loss of unknown rank is checked to be a scalar by an op
  # that may run after this one; a non-scalar predicate would fail first.
  return tf.cond(tf.reduce_any(tf.math.is_nan(loss)), warn, tf.no_op,
                 name="nan_loss")


def note_window_size(position, held, k, window_size):
  """Prints, when a window held other than `window_size` (k x replicas)
  micro-batches, that it was applied as their mean: the window that
  straddles a resume with another k or number of replicas.

  Args:
    position: int64 scalar tensor, the micro-batch ending the window.
    held: float scalar tensor, the micro-batches the window held over all
      replicas.
    k: int, micro-batches per update in this run.
    window_size: int, k x replicas.

  Returns:
    A True tensor, after the print if there was one.
  """

  def note():
    warn = tf.print(
        "WARNING estimator_accum: the window ending at micro-batch", position,
        "held", held, "micro-batches over all replicas, not", window_size,
        "(k =", k, "x replicas): a run resumed with another k or number of "
        "replicas; applied as their mean.", output_stream=sys.stderr)
    with tf.control_dependencies([warn]):
      return tf.constant(True)

  return tf.cond(tf.equal(held, tf.cast(window_size, held.dtype)),
                 lambda: tf.constant(True), note, name="window_size")


# Ops an input pipeline hands its batches out of: tf.data's get_next (one
# per replica under MirroredStrategy), an optional's value, and the queues
# of numpy_input_fn and other TF1 readers.
_BATCH_SOURCES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync",
    "MultiDeviceIteratorGetNextFromShard", "OptionalGetValue",
    "QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeueMany",
    "QueueDequeueUpTo"})
# What a distributed iterator whose last batch may be short decides on
# (TensorFlow 2): a cond hands each replica its batch, or an empty one.
_OPTIONAL_OPS = frozenset({"IteratorGetNextAsOptional", "OptionalHasValue",
                           "OptionalGetValue"})
_CONDS = frozenset({"If", "StatelessIf"})


def hands_out_batches(op):
  """Whether `op` hands out the input pipeline's batches: a get_next, or a
  cond choosing each replica's batch from an iterator's optionals."""
  if op.type in _BATCH_SOURCES:
    return True
  if op.type not in _CONDS:
    return False
  near = [t.op for t in op.inputs]
  near += [t.op for o in near for t in o.inputs]
  return any(o.type in _OPTIONAL_OPS for o in near)


def micro_batch_examples(loss, num_examples):
  """The number of examples in this micro-batch on this replica:
  `num_examples` when given, else the leading dimension of the batch the
  loss (or a gradient) is computed from, when it depends on exactly one op
  of an input pipeline (Estimator's input_fn, Keras's iterator). None
  otherwise.
  """
  if num_examples is not None:
    return num_examples
  seen, pending, batches = set(), list(loss.op.inputs), []
  if loss.op.type in _BATCH_SOURCES:
    pending = [loss]
  while pending:
    tensor = pending.pop()
    if hands_out_batches(tensor.op):
      batches.append(tensor)
    elif tensor.op not in seen:
      seen.add(tensor.op)
      pending.extend(tensor.op.inputs)
  if len({t.op for t in batches}) != 1:
    return None
  batched = [t for t in batches
             if t.shape.rank is not None and t.shape.rank >= 1]
  if not batched:
    return None
  with tf.compat.v1.name_scope("micro_batch_examples"):
    return tf.shape(batched[0], out_type=tf.int64)[0]


@as_written
def reportable_loss(loss, name="gradient_accumulation", across_workers=False):
  """Returns `loss` where it is finite, else the last finite loss reported.

  Estimator stops training with `NanTensorHook` when the loss it is given is
  NaN. A micro-batch with a NaN loss only costs its window, which
  `build_accumulating_train_op` skips, counts and logs; pass this tensor as
  `EstimatorSpec(loss=...)` so that Estimator keeps training past it.

  Build it before the train op (`reported = reportable_loss(loss)`, then
  `build_accumulating_train_op(loss, ...)`): the train op then prints no
  line of its own for a NaN micro-batch, and a skipped window is one line.

  Under `MultiWorkerMirroredStrategy` over several workers, Estimator
  all-reduces the loss it reports across the workers at every micro-batch:
  the one collective left between two window ends, and one that makes the
  workers wait for each other at every micro-batch. The tensor returned
  here is reported as it is on each worker instead (the mean over that
  worker's own devices), so that a micro-batch that ends no window crosses
  no worker boundary. `across_workers=True` keeps Estimator's mean over
  every worker, at the price of that all-reduce. One machine
  (`MirroredStrategy`) and parameter-server training report as before.

  Args:
    loss: scalar floating tf.Tensor, the micro-batch loss.
    name: str, prefix of the variable holding the last finite loss.
    across_workers: bool, have Estimator report the mean over every
      worker's replicas (an all-reduce at every micro-batch) rather than
      this worker's own.

  Returns:
    float32 scalar tf.Tensor.
  """
  _checks.check_graph_mode()
  _checks.check_loss(loss)
  _checks.check_name(name)
  _checks.check_bool("across_workers", across_workers)
  graph_state.owned("reported_losses", set).add(loss.name)
  # Each worker's own in parameter-server training, like its window.
  global_step = tf.compat.v1.train.get_global_step()
  last_finite = state_variable(
      name + "/last_finite_loss", [], tf.float32, per_replica=True,
      local_device=(None if global_step is None else
                    between_graph_worker_device(loss, global_step)))
  loss = tf.cast(loss, tf.float32)
  value = tf.where(tf.math.is_finite(loss), loss, last_finite.read_value())
  with tf.control_dependencies([last_finite.assign(value, read_value=False)]):
    value = tf.identity(value, name="reportable_loss")
  if not across_workers:
    workers.report_on_this_worker(value)
  return value
