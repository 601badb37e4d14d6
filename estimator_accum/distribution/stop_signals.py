"""SIGTERM and SIGINT, for the stop (`preemption`): taken by this
process's Python handlers, and acted on within milliseconds wherever the
main thread waits.

Python runs a signal's handler in the main thread, and only between two
bytecodes: never while that thread waits in session.run (a save, a
step). The signal's number is also written to a pipe at once
(`signal.set_wakeup_fd`), which a thread of this module reads. Native code
may displace Python's SIGTERM handler (TensorFlow's coordination service
installs one that only records the signal, when a
MultiWorkerMirroredStrategy is made): a thread sees that through sigaction
and puts Python's back, and a SIGTERM recorded in between is read from the
coordination service. The handler is taken from the main thread; a train
op built in another thread asks the main thread through a real-time
signal (the errand).
"""

import ctypes
import os
import signal
import sys
import threading
import time

import tensorflow as tf

from estimator_accum import runtime_private
from estimator_accum.distribution import stop_exit, stop_requests, stop_state
from estimator_accum.distribution.stop_state import STOP, STOPPED_EXIT

# The main thread's errand: take SIGTERM (signal.signal needs that thread).
_ERRAND = signal.SIGRTMAX - 3

# How often the process's SIGTERM handler is checked (a sigaction call).
_DISPLACED_POLL_SECONDS = 0.02

# Where TensorFlow's coordination service keeps a SIGTERM its handler
# recorded (tensorflow/core/common_runtime/eager/context_distributed_manager.cc,
# read by tf.distribute.experimental.PreemptionWatcher too): the task's name.
_NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"


def _arrived(signum):
  """A signal's number read from the pipe (or a handler, without one)."""
  end, say = stop_state.exit_now, stop_state.say
  if signum == signal.SIGTERM:
    if STOP.count_sigterm() > 1:
      end(f"a second SIGTERM: exiting now with {STOPPED_EXIT}; the newest "
          "complete checkpoint is the one restored")
    if STOP.ask(signalled=True):
      if STOP.serving_config is not None:
        stop_exit.start_serving_until_saved()
        return
      if STOP.began is None:
        end("SIGTERM before training began (no micro-batch has run in this "
            f"process): nothing to save; exiting with {STOPPED_EXIT}")
      parameter_server_job = stop_requests.training_config()
      say("SIGTERM: " + (
          "stopping at this task's next micro-batch and asking the other "
          "tasks to stop; the chief saves" if parameter_server_job else
          "stopping at the micro-batch every task agrees on (the next but "
          "one); the open window is saved") + ", then this process exits "
          f"with {STOPPED_EXIT} (a second SIGTERM or SIGINT ends it at once)")
      stop_exit.start_exit()
      stop_exit.start_posting(parameter_server_job)
    else:
      # A peer's stop is under way here already (the launcher stopping
      # the others after a task's exit): it goes on.
      say("SIGTERM: already stopping (a peer task was told to stop)")
  elif signum == signal.SIGINT and STOP.asked_at is not None:
    end(f"SIGINT while stopping: exiting now with {STOPPED_EXIT}")


def _on_sigterm(signum, frame):
  del frame
  if not STOP.watching:
    _arrived(signum)


def _on_sigint(signum, frame):
  if not STOP.watching:
    _arrived(signum)
  if STOP.asked_at is None:
    signal.default_int_handler(signum, frame)


def _watch(reader):
  while True:
    for signum in os.read(reader, 64):
      # A handler the program installed after this module's owns it.
      if signum != signal.SIGTERM or _ours():
        _arrived(signum)


def _ours():
  return signal.getsignal(signal.SIGTERM) is _on_sigterm


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
      _LIBC.sigaction(int(signal.SIGTERM), ctypes.byref(STOP.action), None)


def _displaced():
  """Whether native code replaced Python's SIGTERM handler while Python
  believes this module's is installed."""
  if STOP.action is None or not _ours():
    return False
  action = _current_action()
  return action is not None and action.handler != STOP.action.handler


def _watch_notice():
  """Waits, in a thread, for a SIGTERM TensorFlow's coordination service
  recorded (on this task or a peer) and stops as for one of ours."""
  if STOP.notice_watched or not (
      runtime_private.coordination_service_configured()):
    return
  if not STOP.take("notice_watched"):  # (the keeper and the main thread)
    return

  def wait():
    try:
      task = runtime_private.wait_for_coordination_service_value(_NOTICE_KEY)
    except tf.errors.OpError:
      return  # the service ended with the job
    stop_state.say(
        f"SIGTERM recorded by TensorFlow's coordination service (on {task}) "
        "before this process took the signal back: acting on it")
    _arrived(signal.SIGTERM)

  threading.Thread(target=wait, daemon=True,
                   name="estimator_accum_sigterm_notice").start()


def _take_sigterm(*_):
  """In the main thread: SIGTERM is this module's from now on (again, if
  the program or native code installed a handler since)."""
  if not stop_state.enabled():
    return
  if _displaced():
    _watch_notice()
  signal.signal(signal.SIGTERM, _on_sigterm)
  signal.siginterrupt(signal.SIGTERM, False)
  if not STOP.take("handler_taken"):
    return
  STOP.action = _current_action()
  if STOP.action is not None:
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
  STOP.watching = True
  threading.Thread(target=_watch, args=(reader,), daemon=True,
                   name="estimator_accum_signals").start()


def install_errand():
  if threading.current_thread() is threading.main_thread():
    signal.signal(_ERRAND, _take_sigterm)
    signal.siginterrupt(_ERRAND, False)
    if not stop_state.enabled():
      return
    # A parameter server builds no train op: it serves until told.
    STOP.serving_config = stop_requests.serving_config()
    if (STOP.serving_config is not None
        or signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
      _take_sigterm()


def ask_main_thread_to_take_sigterm():
  if threading.current_thread() is threading.main_thread():
    _take_sigterm()
  elif signal.getsignal(_ERRAND) is _take_sigterm:
    signal.pthread_kill(threading.main_thread().ident, _ERRAND)
  else:
    stop_state.say(
        "SIGTERM is not answered in this process (estimator_accum was first "
        "imported outside the main thread): a stop saves nothing; import it "
        "from the main thread")

