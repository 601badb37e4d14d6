"""This process's stop, as one state: asked (by SIGTERM or a peer),
agreed (the micro-batch that found it), exiting; the micro-batches' times
the stop waits by; and the last line before the exit.

Every write takes `STOP.lock`, and so does every read-then-write; a thread
that polls one field (`asked_at`, `stopped_step`) reads it without: it is
set once. Pure Python: the signal handlers, the session's host ops and the
exit thread all use it.
"""

import os
import signal
import sys
import threading
import time
import weakref

ENABLED_ENV = "ESTIMATOR_ACCUM_STOP_ON_SIGTERM"
STOPPED_EXIT = 128 + int(signal.SIGTERM)


def enabled():
  return os.environ.get(ENABLED_ENV, "1") != "0"


def say(line):
  sys.stderr.write(f"[estimator_accum] {line}\n")
  sys.stderr.flush()


class StopState:
  """The stop's state (see the module)."""

  def __init__(self):
    self.lock = threading.Lock()
    # The stop: asked, by whom, agreed, and at which micro-batch.
    self.asked_at = None      # time.monotonic() of the SIGTERM or agreement
    self.signalled = False    # this process got the SIGTERM
    self.sigterms = 0
    self.agreed = False       # every replica and worker agreed to stop
    self.stopped_step = None  # the micro-batch counter when agreed
    self.graph = None         # the graph whose train op stopped
    self.exiting = False
    # The micro-batches, as the stop's exit thread reads them.
    self.began = None         # when the last micro-batch began
    self.started_step = None  # the global step the last micro-batch began at
    self.ended_step = None    # ... and the last one that ended
    self.longest = 0.0        # seconds, of the longest that ended
    self.last_graph = None    # a weakref to the last micro-batch's graph
    # A parameter-server job's stop requests read first (stop_requests),
    # and this parameter server's TF_CONFIG (None on any other task).
    self.requests = None
    self.serving_config = None  # this parameter server's TF_CONFIG
    # The signal plumbing, set by the main thread (stop_signals).
    self.armed = False
    self.handler_taken = False
    self.watching = False     # a thread reads the signals' pipe
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

  def count_sigterm(self):
    """The number of SIGTERMs so far, this one included."""
    with self.lock:
      self.sigterms += 1
      return self.sigterms

  def agree(self):
    """Records that every replica and worker agreed to stop; True the
    first time."""
    if self.agreed:
      return False
    # Asked first: whoever sees `agreed` reads the time the stop began.
    self.ask(signalled=False)
    return self.take("agreed")

  def stop_at(self, step, graph):
    """Records the micro-batch the agreed stop stopped before; True the
    first time."""
    with self.lock:
      if self.stopped_step is not None:
        return False
      self.stopped_step, self.graph = int(step), graph
      return True

  def micro_batch_checked(self, step, graph):
    """A micro-batch at `step` of `graph` passed its stop check."""
    with self.lock:
      self.last_graph, self.started_step = weakref.ref(graph), int(step)

  def micro_batch_began(self, requests):
    """A micro-batch's flag is made; `requests`: a parameter-server job's
    stop requests read now. Whether a stop was asked elsewhere (more
    requests than the first value read)."""
    with self.lock:
      self.began = time.monotonic()
      if self.requests is None:
        self.requests = int(requests)
      return int(requests) > self.requests

  def micro_batch_ended(self, step):
    with self.lock:
      self.ended_step = int(step)
      if self.began is not None:
        self.longest = max(self.longest, time.monotonic() - self.began)

  def take(self, field):
    """Sets the flag `field` (a name of this object's); True the first
    time."""
    with self.lock:
      if getattr(self, field):
        return False
      setattr(self, field, True)
      return True


STOP = StopState()


def stopping():
  """Whether this process is stopping: told to stop by SIGTERM, or by a
  peer task (a hook's `end` may then skip work the save waits behind)."""
  return STOP.asked_at is not None


# Held from a process's last line to its exit: the stop's thread and the
# main thread (at its end) can both find the save done, and each would say
# so. Reentrant: a second SIGTERM's handler can interrupt the thread that
# holds it.
_LAST_WORDS = threading.RLock()


def exit_now(line=None):
  """Says `line`, the process's last, and exits with 143; a second caller
  waits here for the first one's exit."""
  _LAST_WORDS.acquire()  # never released: os._exit follows
  if line is not None:
    say(line)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, RuntimeError):  # (reentrant in a handler)
      pass
  os._exit(STOPPED_EXIT)
