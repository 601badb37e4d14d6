"""A task told to stop saves its open window and exits, by default.

Kubernetes deleting a pod, Slurm cancelling a job and a spot VM being
reclaimed all send SIGTERM, then SIGKILL after a grace period (30 s by
default). A process that builds an accumulating train op in a graph
(Estimator, tf.compat.v1) answers SIGTERM so:

1. It asks to stop, in one line. A second SIGTERM, or SIGINT, now ends
   the process at once, wherever it waits (the signals are read from
   `signal.set_wakeup_fd`'s pipe by a thread of this module: Python runs
   a handler in the main thread only between bytecodes, never while that
   thread waits in session.run).
2. Every replica, and under MultiWorkerMirroredStrategy every worker,
   agrees on one micro-batch to stop before: each micro-batch all-reduces
   a stop flag (a scalar sum, beside the window's own collectives), and
   the micro-batch after the one that found it set raises OutOfRangeError
   in its first op, a check every state update, the loss and every
   collective of it wait for: it changes nothing and leaves no collective
   half done. Estimator ends as at the end of its input, and its
   checkpoint saver saves the state after the last micro-batch that ran,
   open window included (the ordered saves of `checkpoints.ordered_saves`
   keep every worker's save consistent). A worker that was not signalled
   stops at the same micro-batch. A parameter-server job has no collective
   every task runs, and trains asynchronously: the request goes through
   the ps (`stop_requests`), each training task stops at its next
   micro-batch, the chief saves, a worker (whose window is its own, never
   in the checkpoint) exits at once, and a parameter server told to stop
   serves the variables until the training tasks have exited.
3. Once that checkpoint is complete (the Saver's checkpoint state names
   it), the process says so in one line and exits with 143 (128 +
   SIGTERM). If no checkpoint is complete `ESTIMATOR_ACCUM_STOP_SECONDS`
   (default 20) after the stop began (checkpoints turned off, a save that
   cannot finish), it exits with 143 then: the newest complete checkpoint
   is the one restored, never a half-written one.

Why by default, and no call to add: the signal has to reach the window,
and only the window knows the micro-batch it is in. The handler is taken
when this module is imported from the main thread (unless the program has
a SIGTERM handler of its own by then), so a stop before training begins
(the strategy being made, the graph built, the session initialised) exits
with 143 at once: there is nothing to save yet. TensorFlow's coordination
service (on for MultiWorkerMirroredStrategy) installs its own SIGTERM
handler when the strategy is made, which only records the signal: a
thread of this module sees the process's handler displaced (sigaction)
within milliseconds and puts Python's back, and a signal TensorFlow's
handler recorded in between is not lost: TensorFlow writes it to the
coordination service (TF_DEFAULT_PREEMPTION_NOTICE_KEY), where this
module waits for it. Building the first train op takes it again (from the
main thread, or by asking it: a real-time signal this module handles;
Estimator builds a MultiWorkerMirroredStrategy graph in a replica thread).

ESTIMATOR_ACCUM_STOP_ON_SIGTERM=0 turns this off. Not inside a
tf.function (TensorFlow 2 Keras has its own BackupAndRestore).
"""

import atexit
import ctypes
import gc
import os
import signal
import sys
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum import tf_private
from estimator_accum.distribution import health, stop_requests, watchdog

ENABLED_ENV = "ESTIMATOR_ACCUM_STOP_ON_SIGTERM"
SECONDS_ENV = "ESTIMATOR_ACCUM_STOP_SECONDS"
DEFAULT_SECONDS = 20.0
# A parameter server told to stop serves the variables this much longer
# than a training task waits for its save.
SERVING_MARGIN_SECONDS = 3.0
STOPPED_EXIT = 128 + int(signal.SIGTERM)
# The main thread's errand: take SIGTERM (signal.signal needs that thread).
_ERRAND = signal.SIGRTMAX - 3
_POLL_SECONDS = 0.05
# How often a stop waiting for this task's micro-batch asks whether a peer
# it waits for has exited (_ExitedPeers).
_PROBE_SECONDS = 0.5
# How often the process's SIGTERM handler is checked (a sigaction call).
_DISPLACED_POLL_SECONDS = 0.02
# Where TensorFlow's coordination service keeps a SIGTERM its handler
# recorded (tensorflow/core/common_runtime/eager/context_distributed_manager.cc,
# read by tf.distribute.experimental.PreemptionWatcher too): the task's name.
_NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"


def _say(line):
  sys.stderr.write(f"[estimator_accum] {line}\n")
  sys.stderr.flush()


class _Stop:
  """This process's stop: asked (by SIGTERM, or a peer), agreed (the
  micro-batch that found it), saved and exited. Thread safe."""

  def __init__(self):
    self.lock = threading.Lock()
    self.asked_at = None      # time.monotonic() of the SIGTERM or agreement
    self.signalled = False    # this process got the SIGTERM
    self.stopped_step = None  # the micro-batch counter when agreed
    self.graph = None         # the graph whose train op stopped
    self.exiting = False
    self.handler_taken = False
    self.armed = False
    self.watching = False     # a thread reads the signals' pipe
    self.sigterms = 0
    self.agreed = False       # every replica and worker agreed to stop
    self.began = None         # when the last micro-batch began
    self.started_step = None  # the global step the last micro-batch began at
    self.ended_step = None    # ... and the last one that ended
    self.longest = 0.0        # seconds, of the longest that ended
    self.last_graph = None    # the last micro-batch's graph (a weakref:
                              # train() returned, it is gone)
    self.requests = None      # the parameter-server job's stop requests
                              # read first (stop_requests)
    self.serving = None       # TF_CONFIG, on a parameter server
    self.action = None        # the C-level SIGTERM action Python installed
    self.notice_watched = False

  def ask(self, signalled):
    """Records the stop; True the first time."""
    with self.lock:
      self.signalled |= signalled
      if self.asked_at is not None:
        return False
      self.asked_at = time.monotonic()
      return True


_STOP = _Stop()


def enabled():
  return os.environ.get(ENABLED_ENV, "1") != "0"


def stopping():
  """Whether this process is stopping: told to stop by SIGTERM, or by a
  peer task (a hook's `end` may then skip work the save waits behind)."""
  return _STOP.asked_at is not None


def _seconds():
  return watchdog.seconds_from_environment(SECONDS_ENV, DEFAULT_SECONDS)


# The signal side. Python runs a signal's handler in the main thread, and
# only between two bytecodes: never while that thread waits in session.run
# (a save, a step). The signal's number is also written to a pipe at once
# (signal.set_wakeup_fd), which a thread of this module reads: it acts
# within milliseconds wherever the main thread is.

def _arrived(signum):
  """A signal's number read from the pipe (or a handler, without one)."""
  if signum == signal.SIGTERM:
    with _STOP.lock:
      _STOP.sigterms += 1
      sigterms = _STOP.sigterms
    if sigterms > 1:
      _exit(f"a second SIGTERM: exiting now with {STOPPED_EXIT}; the newest "
            "complete checkpoint is the one restored")
    if _STOP.ask(signalled=True):
      if _STOP.serving is not None:
        _start_serving_until_saved()
        return
      if _STOP.began is None:
        _exit(f"SIGTERM before training began (no micro-batch has run in "
              f"this process): nothing to save; exiting with {STOPPED_EXIT}")
      parameter_server_job = stop_requests.training_config()
      _say("SIGTERM: " + (
          "stopping at this task's next micro-batch and asking the other "
          "tasks to stop; the chief saves" if parameter_server_job else
          "stopping at the micro-batch every task agrees on (the next but "
          "one); the open window is saved") + ", then this process exits "
           f"with {STOPPED_EXIT} (a second SIGTERM or SIGINT ends it at once)")
      _start_exit()
      _start_posting(parameter_server_job)
    else:
      # A peer's stop is under way here already (the launcher stopping
      # the others after a task's exit): it goes on.
      _say("SIGTERM: already stopping (a peer task was told to stop)")
  elif signum == signal.SIGINT and _STOP.asked_at is not None:
    _exit(f"SIGINT while stopping: exiting now with {STOPPED_EXIT}")


def _on_sigterm(signum, frame):
  del frame
  if not _STOP.watching:
    _arrived(signum)


def _on_sigint(signum, frame):
  if not _STOP.watching:
    _arrived(signum)
  if _STOP.asked_at is None:
    signal.default_int_handler(signum, frame)


def _watch(reader):
  while True:
    for signum in os.read(reader, 64):
      # A handler the program installed after this module's owns it.
      if signum != signal.SIGTERM or _ours():
        _arrived(signum)


def _ours():
  return signal.getsignal(signal.SIGTERM) is _on_sigterm


# The C side: TensorFlow's coordination service agent installs a SIGTERM
# handler of its own (std::signal, which only records the signal) when a
# MultiWorkerMirroredStrategy is made. Python still believes its handler is
# installed (signal.getsignal); sigaction tells.

class _Sigaction(ctypes.Structure):
  """glibc's struct sigaction on x86-64 and aarch64 Linux."""
  _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
              ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def _libc():
  try:
    return ctypes.CDLL(None, use_errno=True)
  except OSError:
    return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def _current_action():
  action = _Sigaction()
  if _LIBC is None or _LIBC.sigaction(int(signal.SIGTERM), None,
                                      ctypes.byref(action)) != 0:
    return None
  return action


def _keep_sigterm():
  """Puts Python's SIGTERM handler back whenever native code displaced it,
  and then waits for a signal the displacing handler recorded."""
  while True:
    time.sleep(_DISPLACED_POLL_SECONDS)
    if _displaced():
      # Watch TensorFlow's record first, then take the signal back: a
      # SIGTERM in between is in one of the two.
      _watch_notice()
      _LIBC.sigaction(int(signal.SIGTERM), ctypes.byref(_STOP.action), None)


def _displaced():
  """Whether native code replaced Python's SIGTERM handler while Python
  believes this module's is installed."""
  if _STOP.action is None or not _ours():
    return False
  action = _current_action()
  return action is not None and action.handler != _STOP.action.handler


def _watch_notice():
  """Waits, in a thread, for a SIGTERM TensorFlow's coordination service
  recorded (on this task or a peer) and stops as for one of ours."""
  if _STOP.notice_watched:
    return
  if not tf_private.coordination_service_configured():
    return
  _STOP.notice_watched = True

  def wait():
    try:
      task = tf_private.wait_for_coordination_service_value(_NOTICE_KEY)
    except tf.errors.OpError:
      return  # the service ended with the job
    _say(f"SIGTERM recorded by TensorFlow's coordination service (on "
         f"{task}) before this process took the signal back: acting on it")
    _arrived(signal.SIGTERM)

  threading.Thread(target=wait, daemon=True,
                   name="estimator_accum_sigterm_notice").start()


def _take_sigterm(*_):
  """In the main thread: SIGTERM is this module's from now on (again, if
  the program or native code installed a handler since)."""
  if not enabled():
    return
  if _displaced():
    _watch_notice()
  signal.signal(signal.SIGTERM, _on_sigterm)
  signal.siginterrupt(signal.SIGTERM, False)
  if _STOP.handler_taken:
    return
  _STOP.handler_taken = True
  _STOP.action = _current_action()
  if _STOP.action is not None:
    threading.Thread(target=_keep_sigterm, daemon=True,
                     name="estimator_accum_sigterm_keeper").start()
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_sigint)
  reader, writer = os.pipe()
  os.set_blocking(writer, False)
  previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
  if previous != -1:
    # The program reads its own wakeup pipe (asyncio's loop): keep it; the
    # handlers act when the main thread next runs Python.
    signal.set_wakeup_fd(previous)
    os.close(reader)
    os.close(writer)
    return
  _STOP.watching = True
  threading.Thread(target=_watch, args=(reader,), daemon=True,
                   name="estimator_accum_signals").start()


def _install_errand():
  if threading.current_thread() is threading.main_thread():
    signal.signal(_ERRAND, _take_sigterm)
    signal.siginterrupt(_ERRAND, False)
    if not enabled():
      return
    # A parameter server builds no train op: it serves until told.
    _STOP.serving = stop_requests.serving_config()
    if (_STOP.serving is not None
        or signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
      _take_sigterm()


_install_errand()


def _ask_main_thread_to_take_sigterm():
  if threading.current_thread() is threading.main_thread():
    _take_sigterm()
  elif signal.getsignal(_ERRAND) is _take_sigterm:
    signal.pthread_kill(threading.main_thread().ident, _ERRAND)
  else:
    _say("SIGTERM is not answered in this process (estimator_accum was "
         "first imported outside the main thread): a stop saves nothing; "
         "import it from the main thread")


# The graph side (the session's threads). A micro-batch first checks the
# agreement of the one before (a host op reading this module's state): if
# a stop was agreed, it raises there, before it has started any collective
# (its loss, its gradients and its flag all wait for the check), as a job
# whose input ends fails in its input. A micro-batch that raised with a
# collective under way would abort the collectives of its worker, and a
# peer still reading from them would fail (`Delete called on non-empty
# BufRendezvous`): measured, one stop in three under Slurm. Then it
# all-reduces its own flag, and the agreement is kept for the next one.

def _flag(requests):
  """This process's stop flag; `requests`: a parameter-server job's stop
  requests (0 in any other job), past the first value read is a stop."""
  _STOP.began = time.monotonic()
  with _STOP.lock:
    if _STOP.requests is None:
      _STOP.requests = int(requests)
    asked_elsewhere = int(requests) > _STOP.requests
  if asked_elsewhere and _STOP.ask(signalled=False):
    _say("another task of this parameter-server job was told to stop: "
         "stopping too")
  return np.float32(_STOP.asked_at is not None)


def _ended(step):
  """A micro-batch's last op: it has run whole (its window's apply too)."""
  _STOP.ended_step = int(step)
  if _STOP.began is not None:
    _STOP.longest = max(_STOP.longest, time.monotonic() - _STOP.began)
  return np.int64(0)


def _why_nothing_is_left_to_save():
  """Why stopping now loses nothing, or None (the stop waits for the next
  micro-batch). Read from what ran, not from how long ago a micro-batch
  began: between two micro-batches (a hook, a save at step 0, may take
  minutes) the stop waits unless the newest complete checkpoint holds
  every micro-batch that ran (train() returned and saved; the chief
  evaluates) or that graph saves none. A micro-batch that waits on a peer
  which has exited (its address refuses connections: _ExitedPeers), or is
  still running after 3 times the longest one that ended (5 s at least)
  while a peer does not answer (frozen, cut off; alone in its process,
  none is asked), waits on a lost peer: neither it nor a save after it
  can end. A peer that answers may be between two micro-batches, in a
  hook or a save longer than that: the stop waits for it, until its
  deadline."""
  step = _STOP.started_step
  if step is None:
    return "no micro-batch has run"
  if _STOP.ended_step != step:
    gone = _PEERS.gone()
    if gone:
      return (f"micro-batch {step} waits on {', '.join(gone)}, which has "
              "exited: it cannot end")
    running = time.monotonic() - _STOP.began
    # A peer that answers is alive and will join the micro-batch (it may be
    # between two, in a hook or a save, for longer than this one has run);
    # one that is frozen, cut off or stuck does not answer.
    if (running > max(5.0, 3 * _STOP.longest) and
        not _PEERS.all_answered):
      return (f"micro-batch {step} has run {running:.0f} s, 3 times the "
              "longest before it, and a peer it waits on does not answer: "
              "it cannot end")
    return None
  graph = _STOP.last_graph()
  if graph is None:
    return "training ended, and its graph with it"
  savers = graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
  if not savers:
    return "its graph saves no checkpoint"
  if _newest_saved_step(savers) > step:
    return "no micro-batch is running, and every one that ran is saved"
  return None


class _ExitedPeers:
  """The chief and worker peers of a multi-worker job that have exited,
  asked while a stop waits for this task's micro-batch: a peer told to stop
  between two micro-batches, with every one that ran saved, exits at once,
  and the micro-batch this task had begun waits for it forever. Its
  address then refuses connections (`health.peer_answers`);
  asked every `_PROBE_SECONDS`, a peer that refused twice in a row is
  gone; `all_answered` says whether every peer answered the last probe
  (None: none was asked). Nothing is asked in a parameter-server job (its
  tasks stop apart) or outside a cluster."""

  def __init__(self):
    self._next = 0.0
    self._refused = set()
    self.all_answered = None

  def gone(self):
    now = time.monotonic()
    if now < self._next:
      return []
    self._next = now + _PROBE_SECONDS
    config = tfc.task_of(tfc.TRAINING_TYPES)
    if not config or stop_requests.training_config() is not None:
      return []
    answers = health.peer_answers(config, deadline=_PROBE_SECONDS)
    self.all_answered = all(error is None for error in answers.values())
    refusing = {name for name, error in answers.items()
                if error == "unavailable"}
    gone, self._refused = sorted(refusing & self._refused), refusing
    return gone


_PEERS = _ExitedPeers()


def _agree(agreed):
  """Keeps a stop every replica and worker agreed on, for the next
  micro-batch's check."""
  if agreed > 0 and not _STOP.agreed:
    _STOP.ask(signalled=False)
    _STOP.agreed = True
  return np.int64(0)


def _check(step, graph):
  """Raises StopIteration (OutOfRangeError) once a stop was agreed;
  returns `step`."""
  if not _STOP.agreed:
    _STOP.last_graph, _STOP.started_step = weakref.ref(graph), int(step)
    return np.int64(step)
  with _STOP.lock:
    first = _STOP.stopped_step is None
    if first:
      _STOP.stopped_step, _STOP.graph = int(step), graph
  if first:
    cause = "SIGTERM" if _STOP.signalled else "a peer task was told to stop"
    _say(f"stopping ({cause}) at global step {int(step)}: " + (
        "every task stops here; saving the state, open window included"
        if stop_requests.training_config() is None else
        "saving the shared state (this task's own open window is dropped)"
        if stop_requests.saves_checkpoints() else "the chief saves"))
    _start_exit()
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
  _seconds()  # a bad ESTIMATOR_ACCUM_STOP_SECONDS is refused at the build
  with _STOP.lock:
    if _STOP.armed:
      return
    _STOP.armed = True
  _ask_main_thread_to_take_sigterm()
  atexit.register(_exit_if_stopped)


# The exit.

def _start_exit():
  threading.Thread(target=_exit_when_saved, name="estimator_accum_stop",
                   daemon=True).start()


def _exit_if_stopped():
  # The main thread ends (train() returned, the script ran out) before the
  # exit thread saw the save: it waits here instead.
  if _STOP.asked_at is not None:
    _exit_when_saved(first=False)


def _exit_when_saved(first=True):
  """Exits with 143 once the checkpoint of the stopped step is complete,
  or when the stop's time is up."""
  if first:
    with _STOP.lock:
      if _STOP.exiting:
        return
      _STOP.exiting = True
  # A graph train() was done with is unreferenced but kept by its cycles
  # until a collection: gone, it says training ended.
  gc.collect()
  deadline = _STOP.asked_at + _seconds()
  saves = stop_requests.saves_checkpoints()  # read TF_CONFIG once
  while time.monotonic() < deadline:
    saved = _saved_checkpoint()
    if saved:
      _exit(f"stopped: global step {_STOP.stopped_step} saved in {saved}, "
            f"{time.monotonic() - _STOP.asked_at:.1f} s after the stop; "
            f"exiting with {STOPPED_EXIT}")
    if _STOP.stopped_step is not None and not _savers():
      _exit(f"stopped at global step {_STOP.stopped_step}; this graph "
            f"saves no checkpoint; exiting with {STOPPED_EXIT}")
    if _STOP.stopped_step is not None and not saves:
      _exit(f"stopped at global step {_STOP.stopped_step}; the chief saves "
            "(a parameter-server worker's open window is its own, and is "
            f"dropped, as at any restart of it); exiting with {STOPPED_EXIT}")
    why = None if _STOP.stopped_step is not None else (
        _why_nothing_is_left_to_save())
    if why is not None:
      _exit(f"SIGTERM while not training ({why}); exiting with "
            f"{STOPPED_EXIT}")
    time.sleep(_POLL_SECONDS)
  _exit(f"stopped: no checkpoint of the stop completed within {_seconds():g} "
        f"s ({SECONDS_ENV}); the newest complete one is restored; exiting "
        f"with {STOPPED_EXIT}")


def _start_posting(config):
  """Asks the other tasks of a parameter-server job to stop (a thread:
  it waits for the ps); nothing in any other job."""
  if config is None:
    return

  def post():
    error = stop_requests.post(config)
    if error:
      _say(f"could not ask the other tasks to stop ({error}); they go on "
           "until told themselves")

  threading.Thread(target=post, daemon=True,
                   name="estimator_accum_stop_request").start()


def _start_serving_until_saved():
  """A parameter server told to stop: asks every training task to stop,
  serves the variables until they have (the chief's save needs them),
  then exits with 143."""
  config = _STOP.serving
  try:
    seconds = _seconds() + SERVING_MARGIN_SECONDS
  except ValueError as error:
    # The training tasks refused it when they built their train ops.
    _say(f"{error} Serving up to {DEFAULT_SECONDS:g} s.")
    seconds = DEFAULT_SECONDS + SERVING_MARGIN_SECONDS
  _say("SIGTERM on a parameter server: asking every training task to stop "
       "and save; serving the variables until they have exited (at most "
       f"{seconds:g} s), then exiting with {STOPPED_EXIT} (a second SIGTERM "
       "or SIGINT ends it at once)")

  def serve():
    error = stop_requests.post(config)
    if error:
      _say(f"could not ask the training tasks to stop ({error})")
    left = _STOP.asked_at + seconds - time.monotonic()
    if stop_requests.wait_for_training_to_end(config, max(left, 0.0)):
      _exit(f"stopped: every training task has exited, "
            f"{time.monotonic() - _STOP.asked_at:.1f} s after the stop; "
            f"exiting with {STOPPED_EXIT}")
    _exit(f"stopped: training tasks still answer after {seconds:g} s; "
          f"exiting with {STOPPED_EXIT}")

  threading.Thread(target=serve, daemon=True,
                   name="estimator_accum_stop").start()


def _savers():
  graph = _STOP.graph
  return [] if graph is None else graph.get_collection(
      tf.compat.v1.GraphKeys.SAVERS)


def _saved_checkpoint():
  """The path of a complete checkpoint at or after the stopped step (the
  Saver's checkpoint state names it), or None."""
  step = _STOP.stopped_step
  if step is None:
    return None
  for path, saved_step in _complete_checkpoints(_savers()):
    if saved_step >= step:
      return path
  return None


def _newest_saved_step(savers):
  return max((s for _, s in _complete_checkpoints(savers)), default=-1)


def _complete_checkpoints(savers):
  """[(path, global step)] of the savers' checkpoints that are complete:
  the newest one their directory's checkpoint state names."""
  found, newest = [], {}  # newest: directory -> its state's newest path
  for saver in savers:
    for path in saver.last_checkpoints:
      directory = os.path.dirname(path)
      if directory not in newest:  # read once per poll, not once per path
        state = tf.train.get_checkpoint_state(directory)
        newest[directory] = state and os.path.abspath(
            state.model_checkpoint_path)
      if newest[directory] != os.path.abspath(path):
        continue
      try:
        found.append((path, int(path.rsplit("-", 1)[1])))
      except (IndexError, ValueError):
        continue
  return found


# Held from a process's last line to its exit: the stop's thread and the
# main thread (at its end) can both find the save done, and each said so
# (a line twice, 1 stop of 3 with forked tasks). Reentrant: a second
# SIGTERM's handler can interrupt the thread that holds it.
_LAST_WORDS = threading.RLock()


def _exit(line=None):
  """Says `line`, the process's last, and exits with 143; a second caller
  waits here for the first one's exit."""
  _LAST_WORDS.acquire()  # never released: os._exit follows
  if line is not None:
    _say(line)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, RuntimeError):  # (reentrant in a handler)
      pass
  os._exit(STOPPED_EXIT)
