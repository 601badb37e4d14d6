"""A task told to stop saves its open window and exits, by default.

Kubernetes deleting a pod, Slurm cancelling a job and a spot VM being
reclaimed all send SIGTERM, then SIGKILL after a grace period (30 s by
default). A process that builds an accumulating train op in a graph
(Estimator, tf.compat.v1) answers SIGTERM so:

1. It asks to stop, in one line; a second SIGTERM, or SIGINT, now ends the
   process at once, wherever it waits (`stop_signals`).
2. Every replica, and under MultiWorkerMirroredStrategy every worker,
   agrees on one micro-batch to stop before (this module, the graph side):
   each micro-batch all-reduces a stop flag, and the micro-batch after the
   one that found it set raises OutOfRangeError in its first op, a check
   every state update, the loss and every collective of it wait for. It
   changes nothing and leaves no collective half done; Estimator ends as at
   the end of its input and saves the state, open window included. A
   parameter-server job, which has no collective every task runs, asks
   through the ps (`stop_requests`).
3. Once that checkpoint is complete the process says so in one line and
   exits with 143 (`stop_exit`); if none is complete
   `ESTIMATOR_ACCUM_STOP_SECONDS` (default 20) after the stop began, it
   exits then, and the newest complete checkpoint is the one restored.

By default, with no call to add: only the window knows the micro-batch it
is in. ESTIMATOR_ACCUM_STOP_ON_SIGTERM=0 turns it off. Not inside a
tf.function (TensorFlow 2 Keras has its own BackupAndRestore).
docs/operations.md says what each line means; the state all of it shares
is `stop_state`'s.
"""

import atexit

import numpy as np
import tensorflow as tf

from estimator_accum import tf_private
from estimator_accum.distribution import (
  stop_exit,
  stop_requests,
  stop_signals,
  stop_state,
)
from estimator_accum.distribution.stop_state import (  # noqa: F401  (public)
  ENABLED_ENV,
  STOP,
  STOPPED_EXIT,
  enabled,
  stopping,
)

SECONDS_ENV = stop_exit.SECONDS_ENV
DEFAULT_SECONDS = stop_exit.DEFAULT_SECONDS

stop_signals.install_errand()


# The graph side (the session's threads). A micro-batch first checks the
# agreement of the one before (a host op reading the stop's state): if a
# stop was agreed, it raises there, before it has started any collective
# (its loss, its gradients and its flag all wait for the check), as a job
# whose input ends fails in its input. A micro-batch that raised with a
# collective under way would abort the collectives of its worker, and a
# peer still reading from them would fail. Then it all-reduces its own
# flag, and the agreement is kept for the next one.


def _flag(requests):
  """This process's stop flag; `requests`: a parameter-server job's stop
  requests (0 in any other job), past the first value read is a stop."""
  if STOP.micro_batch_began(requests) and STOP.ask(signalled=False):
    stop_state.say("another task of this parameter-server job was told to "
                   "stop: stopping too")
  return np.float32(STOP.asked_at is not None)


def _ended(step):
  """A micro-batch's last op: it has run whole (its window's apply too)."""
  STOP.micro_batch_ended(step)
  return np.int64(0)


def _agree(agreed):
  """Keeps a stop every replica and worker agreed on, for the next
  micro-batch's check."""
  if agreed > 0:
    STOP.agree()
  return np.int64(0)


def _check(step, graph):
  """Raises StopIteration (OutOfRangeError) once a stop was agreed;
  returns `step`."""
  if not STOP.agreed:
    STOP.micro_batch_checked(step, graph)
    return np.int64(step)
  if STOP.stop_at(step, graph):
    cause = "SIGTERM" if STOP.signalled else "a peer task was told to stop"
    stop_state.say(f"stopping ({cause}) at global step {int(step)}: " + (
        "every task stops here; saving the state, open window included"
        if stop_requests.training_config() is None else
        "saving the shared state (this task's own open window is dropped)"
        if stop_requests.saves_checkpoints() else "the chief saves"))
    stop_exit.start_exit()
  raise StopIteration(f"stopped before micro-batch {int(step)} (SIGTERM)")


def gate(loss, trained, global_step, sum_over_replicas):
  """`trained` ([(gradient, variable)]) with each gradient waiting for this
  micro-batch's stop check, and the op that all-reduces the stop flag
  (`sum_over_replicas`: a callable, list -> list) for the next one, to run
  with the train op; `loss` (a tensor or None), the flag and so every
  collective of the micro-batch wait for the check too. As it is, and
  None, when turned off or in a tf.function."""
  if not enabled() or tf.compat.v1.get_default_graph().building_function:
    return trained, None
  _arm_once()
  graph = tf.compat.v1.get_default_graph()
  check = tf.numpy_function(
      lambda step: _check(step, graph),
      [tf.cast(global_step.read_value(), tf.int64)], tf.int64,
      stateful=True, name="stop_check")
  if loss is not None:
    # Estimator all-reduces the loss it is given under a multi-worker
    # strategy: that collective waits too.
    tf_private.add_control_inputs(loss.op, [check.op])
  # A parameter-server job has no collective every task runs: a stop
  # asked elsewhere arrives through the ps (stop_requests).
  requests = (stop_requests.read() if stop_requests.training_config()
              else tf.constant(0, tf.int64))
  # The flag's all-reduce also waits for the micro-batch's input (through
  # the loss, or the gradients): when the input ends, a worker's step fails
  # at its IteratorGetNext, and a collective already started would wait for
  # a part the other workers' ended steps never send.
  with tf.control_dependencies([check, *_made_from_input(loss, trained)]):
    flag = tf.numpy_function(_flag, [requests], tf.float32, stateful=True,
                             name="stop_flag")
  flag.set_shape([])
  agreed = tf.numpy_function(_agree, sum_over_replicas([flag]), tf.int64,
                             stateful=True, name="stop_agreed")
  return [(_after(g, check), v) for g, v in trained], (agreed, check)


def join(train_op, stop):
  """`train_op`, also running what `gate` returned (`stop`), if any, and
  then marking the micro-batch ended."""
  if stop is None:
    return train_op
  agreed, check = stop
  with tf.control_dependencies([train_op, agreed]):
    ended = tf.numpy_function(_ended, [check], tf.int64, stateful=True,
                              name="stop_micro_batch_ended")
  return tf.group(train_op, agreed, ended, name="train_op_stoppable")


def _made_from_input(loss, trained):
  """The tensors of a micro-batch that exist only once its input does."""
  if loss is not None:
    return [loss]
  return [g.values if isinstance(g, tf.IndexedSlices) else g
          for g, _ in trained if g is not None]


def _after(gradient, check):
  if gradient is None:
    return None
  with tf.control_dependencies([check]):
    if isinstance(gradient, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(gradient.values),
                              tf.identity(gradient.indices),
                              gradient.dense_shape)
    return tf.identity(gradient)


def _arm_once():
  stop_exit.seconds()  # a bad ESTIMATOR_ACCUM_STOP_SECONDS is refused here
  if not STOP.take("armed"):
    return
  stop_signals.ask_main_thread_to_take_sigterm()
  atexit.register(stop_exit.exit_if_stopped)
