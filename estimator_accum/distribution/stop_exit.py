"""How a stopping process ends: it waits until the checkpoint of the
micro-batch it stopped at is complete (or until nothing is left to save,
or its time is up), says so in one line and exits with 143. A parameter
server told to stop serves the variables until the training tasks have
gone; a parameter-server job's training task asks the others to stop.
Each runs in a thread of its own."""

import gc
import threading
import time

from clusterspec import config as tfc
from estimator_accum.distribution import (
  health,
  stop_checkpoints,
  stop_requests,
  stop_state,
  watchdog,
)
from estimator_accum.distribution.stop_state import STOP, STOPPED_EXIT

SECONDS_ENV = "ESTIMATOR_ACCUM_STOP_SECONDS"
DEFAULT_SECONDS = 20.0
# A parameter server told to stop serves the variables this much longer
# than a training task waits for its save.
SERVING_MARGIN_SECONDS = 3.0

_POLL_SECONDS = 0.05

# How often a stop waiting for this task's micro-batch asks whether a peer
# it waits for has exited (_ExitedPeers).
_PROBE_SECONDS = 0.5



def seconds():
  return watchdog.seconds_from_environment(SECONDS_ENV, DEFAULT_SECONDS)


def start_exit():
  threading.Thread(target=_exit_when_saved, name="estimator_accum_stop",
                   daemon=True).start()


def exit_if_stopped():
  # The main thread ends (train() returned, the script ran out) before the
  # exit thread saw the save: it waits here instead.
  if STOP.asked_at is not None:
    _exit_when_saved(first=False)


def _exit_when_saved(first=True):
  """Exits with 143 once the checkpoint of the stopped step is complete,
  or when the stop's time is up."""
  if first and not STOP.take("exiting"):
    return
  # A graph train() was done with is unreferenced but kept by its cycles
  # until a collection: gone, it says training ended.
  gc.collect()
  deadline = STOP.asked_at + seconds()
  saves = stop_requests.saves_checkpoints()  # read TF_CONFIG once
  end = stop_state.exit_now
  while time.monotonic() < deadline:
    step = STOP.stopped_step
    saved = stop_checkpoints.saved_checkpoint(step, STOP.graph)
    if saved:
      end(f"stopped: global step {step} saved in {saved}, "
          f"{time.monotonic() - STOP.asked_at:.1f} s after the stop; "
          f"exiting with {STOPPED_EXIT}")
    if step is not None and not stop_checkpoints.savers(STOP.graph):
      end(f"stopped at global step {step}; this graph saves no checkpoint; "
          f"exiting with {STOPPED_EXIT}")
    if step is not None and not saves:
      end(f"stopped at global step {step}; the chief saves (a "
          "parameter-server worker's open window is its own, and is "
          f"dropped, as at any restart of it); exiting with {STOPPED_EXIT}")
    why = None if step is not None else _why_nothing_is_left_to_save()
    if why is not None:
      end(f"SIGTERM while not training ({why}); exiting with {STOPPED_EXIT}")
    time.sleep(_POLL_SECONDS)
  end(f"stopped: no checkpoint of the stop completed within {seconds():g} s "
      f"({SECONDS_ENV}); the newest complete one is restored; exiting with "
      f"{STOPPED_EXIT}")


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
  step = STOP.started_step
  if step is None:
    return "no micro-batch has run"
  if STOP.ended_step != step:
    gone = _PEERS.gone()
    if gone:
      return (f"micro-batch {step} waits on {', '.join(gone)}, which has "
              "exited: it cannot end")
    running = time.monotonic() - STOP.began
    # A peer that answers is alive and will join the micro-batch (it may be
    # between two, in a hook or a save, for longer than this one has run);
    # one that is frozen, cut off or stuck does not answer.
    if (running > max(5.0, 3 * STOP.longest) and
        not _PEERS.all_answered):
      return (f"micro-batch {step} has run {running:.0f} s, 3 times the "
              "longest before it, and a peer it waits on does not answer: "
              "it cannot end")
    return None
  graph = STOP.last_graph()
  if graph is None:
    return "training ended, and its graph with it"
  savers = stop_checkpoints.savers(graph)
  if not savers:
    return "its graph saves no checkpoint"
  if stop_checkpoints.newest_saved_step(savers) > step:
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


def start_posting(config):
  """Asks the other tasks of a parameter-server job to stop (a thread:
  it waits for the ps); nothing in any other job."""
  if config is None:
    return

  def post():
    error = stop_requests.post(config)
    if error:
      stop_state.say(f"could not ask the other tasks to stop ({error}); they "
                     "go on until told themselves")

  threading.Thread(target=post, daemon=True,
                   name="estimator_accum_stop_request").start()


def start_serving_until_saved():
  """A parameter server told to stop: asks every training task to stop,
  serves the variables until they have (the chief's save needs them),
  then exits with 143."""
  config = STOP.serving_config
  try:
    serving = seconds() + SERVING_MARGIN_SECONDS
  except ValueError as error:
    # The training tasks refused it when they built their train ops.
    stop_state.say(f"{error} Serving up to {DEFAULT_SECONDS:g} s.")
    serving = DEFAULT_SECONDS + SERVING_MARGIN_SECONDS
  stop_state.say(
      "SIGTERM on a parameter server: asking every training task to stop "
      "and save; serving the variables until they have exited (at most "
      f"{serving:g} s), then exiting with {STOPPED_EXIT} (a second SIGTERM "
      "or SIGINT ends it at once)")

  def serve():
    error = stop_requests.post(config)
    if error:
      stop_state.say(f"could not ask the training tasks to stop ({error})")
    left = STOP.asked_at + serving - time.monotonic()
    if stop_requests.wait_for_training_to_end(config, max(left, 0.0)):
      stop_state.exit_now(
          f"stopped: every training task has exited, "
          f"{time.monotonic() - STOP.asked_at:.1f} s after the stop; "
          f"exiting with {STOPPED_EXIT}")
    stop_state.exit_now(f"stopped: training tasks still answer after "
                        f"{serving:g} s; exiting with {STOPPED_EXIT}")

  threading.Thread(target=serve, daemon=True,
                   name="estimator_accum_stop_serving").start()
