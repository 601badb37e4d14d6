"""A lost peer ends a multi-worker job in bounded time, by default.

A graph-mode MultiWorkerMirroredStrategy (or parameter-server) task whose
peer is cut off waits in `session.run` forever: the collective, or the
remote variable read, never returns. `health.watch(model_dir)`
ends it, and the project's scripts call it; a user's own script does not
know to. So the first accumulating train op a process builds in a
TF_CONFIG cluster of two or more training tasks arms a watchdog
(`health.Watchdog`, no markers) that asks every peer for its
status, as the explicit one does (every peer counted as up when it starts:
the strategy connected to each before the train op is built), and ends
this process with exit 150 and
one line naming the peer only while this task is stuck: inside a training
step that has not finished for the watchdog's timeout, while the peer has
not answered for as long. A peer that left normally (a worker done while
the chief evaluates, or exits later) ends nothing: this task is not in a
step then.

The train op marks each step's start and end (two host ops, `arm`); the
watchdog reads them. Not armed when a watchdog of `estimator_accum.distribution.health` already
runs in the process, and not with ESTIMATOR_ACCUM_PEER_WATCHDOG=0.
ESTIMATOR_ACCUM_PEER_TIMEOUT sets its timeout (seconds, default 60).

A task inside one step for twice that (ESTIMATOR_ACCUM_STALL_REPORT sets
it) while every peer answers ends nothing, but says so once, with its
main thread's stack (`health.stall_report_lines`): a peer evaluating
between steps looks the same as collectives that never meet, and a job
that waits without a word cannot be diagnosed.
"""

import os
import sys
import threading
import time

import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum.distribution import (
  health,
  progress_bound,
  recreated_session,
)

ENABLED_ENV = "ESTIMATOR_ACCUM_PEER_WATCHDOG"
TIMEOUT_ENV = "ESTIMATOR_ACCUM_PEER_TIMEOUT"
STALL_REPORT_ENV = "ESTIMATOR_ACCUM_STALL_REPORT"


class Steps:
  """When this task began to wait for what it is waiting for (a training
  step, a save's reads of the window), None when it waits for nothing
  (thread safe: the watchdog's thread reads what the session's threads
  write). `enter(n)` starts n waits, `leave()` ends one."""

  def __init__(self):
    self._lock = threading.Lock()
    self._since = None
    self._pending = 0
    self._longest = 0.0  # the longest wait that ended (the progress bound's)

  def enter(self, count=1):
    if count <= 0:
      return 0
    with self._lock:
      if self._since is None:
        self._since = time.monotonic()
      self._pending += int(count)
    return 0

  def leave(self):
    with self._lock:
      self._pending = max(self._pending - 1, 0)
      if not self._pending and self._since is not None:
        self._longest = max(self._longest, time.monotonic() - self._since)
        self._since = None
    return 0

  def waiting(self):
    """Seconds this task has waited in its current step or save (0: in
    none), and the longest such wait that has ended."""
    with self._lock:
      since, longest = self._since, self._longest
    return (0.0 if since is None else time.monotonic() - since), longest

  def stuck(self, seconds):
    """Whether the current step started `seconds` or more ago."""
    with self._lock:
      since = self._since
    return since is not None and time.monotonic() - since >= seconds


_STEPS = Steps()
_ARMED = []


def _cluster():
  """This task's TF_CONFIG when it is a training task of a cluster of two
  or more training tasks, else None."""
  config = tfc.task_of(tfc.TRAINING_TYPES)
  if config is None:
    return None
  training = [t for t, _ in tfc.tasks(config) if t in tfc.TRAINING_TYPES]
  return config if len(training) >= 2 else None


# One parser of seconds from the environment (progress_bound's) for the
# watchdog, the stop and the progress bound.
seconds_from_environment = progress_bound.seconds_from_environment


def _timeout():
  return seconds_from_environment(TIMEOUT_ENV, health.DEFAULT_TIMEOUT)


def _start_once(config):
  """Starts this process's watchdog, once, and says so in one line;
  whether it runs (not when the script watches its peers itself)."""
  if _ARMED:
    return _ARMED[0]
  if health.running():
    _ARMED.append(False)
    return False
  _ARMED.append(True)
  timeout = _timeout()
  stall_report = seconds_from_environment(STALL_REPORT_ENV, 2 * timeout)
  health.Watchdog(config, timeout=timeout,
                  interval=min(health.DEFAULT_INTERVAL, timeout / 2),
                  stuck=_STEPS.stuck,
                  stall_report=stall_report).peers_answered().start()
  # Beside the watchdog's own lines, where a user looks when a job ends.
  sys.stderr.write(
      f"[tfconfig] watching this task's peers: one silent for {timeout:g} s "
      f"while this task waits in a training step ends it with exit "
      f"{health.PEER_LOST_EXIT} and one line (estimator_accum; "
      f"{ENABLED_ENV}=0 turns it off)\n")
  sys.stderr.flush()
  return True


def armed():
  """Whether this process's default watchdog runs."""
  return bool(_ARMED and _ARMED[0])


def entering(function, count):
  """`function` (a host op's), marking `count()` waits begun as it starts:
  a multi-worker save's barrier, before the save's reads of the window."""

  def wrapped(*args):
    _STEPS.enter(count())
    return function(*args)

  return wrapped


def ended(value):
  """`value` (a tensor), read once one wait has been marked ended after
  it (a save's read of the window, which crosses workers)."""
  with tf.control_dependencies([value]):
    left = tf.numpy_function(_STEPS.leave, [], tf.int64, stateful=True,
                             name="peer_watch_read_ended")
  with tf.control_dependencies([left]):
    return tf.identity(value)


def arm(train_op):
  """`train_op`, marking where each step starts and ends for the
  watchdog, and the watchdog started, in a multi-task cluster; else
  `train_op` as it is."""
  config = _cluster()
  if config is None:
    return train_op
  task = config.get(tfc.TASK) or {}
  name = f"{task.get('type')}:{task.get('index', 0)}"
  if tfc.PS not in config.get(tfc.CLUSTER, {}):
    # Collectives: a session remade on one worker alone would hang the job
    # (whichever watchdog runs, or none).
    recreated_session.install(name)
  bounded = progress_bound.start_once(name, _STEPS.waiting)
  watched = (os.environ.get(ENABLED_ENV, "1") != "0" and
             _start_once(config))
  if not (bounded or watched):
    return train_op
  # A host op with no inputs runs as the step starts; the other after
  # every op of the step.
  entered = tf.numpy_function(_STEPS.enter, [], tf.int64, stateful=True,
                              name="peer_watch_step_started")
  with tf.control_dependencies([train_op, entered]):
    left = tf.numpy_function(_STEPS.leave, [], tf.int64, stateful=True,
                             name="peer_watch_step_ended")
  return tf.group(train_op, left, name="train_op_watched")
