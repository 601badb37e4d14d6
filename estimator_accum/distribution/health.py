"""Peer health for a TF_CONFIG job: fail in bounded time, never hang.

A graph-mode MultiWorkerMirroredStrategy or parameter-server job whose peer
is cut off, frozen or killed waits inside `session.run` forever: the
collective or the remote variable read never returns, and TensorFlow's
coordination service, which notices the missing heartbeats, does not end
it. On Kubernetes a hung pod never fails, so nothing restarts the job.

`watch(model_dir)` starts a thread that asks every other task of the
cluster for its status (`WorkerService/GetStatus`, the RPC TensorFlow's own
servers answer, with a deadline) every `interval` seconds. A task that has
not answered for `timeout` seconds is lost: this process prints one line
naming it and exits with `PEER_LOST_EXIT` (from any thread: the main one
is stuck in C++). Slow is not dead: one answer per `timeout` keeps a peer
alive, so a lossy link that makes every step many times slower still
finishes.

With a `model_dir`, every training task (chief, workers) also keeps a
marker in `model_dir/.estimator_accum_tasks/` that it rewrites each
interval:
  * a task whose peer answers but whose marker does not change within
    `timeout` does not share the model_dir (every task of an Estimator job
    needs the same one): one line, exit `MODEL_DIR_NOT_SHARED_EXIT`;
  * a task that ends normally (`Watchdog.finish`, or leaving the `with`
    block) marks itself done: its peers then stop asking for it instead of
    counting it lost; a parameter server exits 0 once every training task
    is done (on Kubernetes nothing else would end it).

Exit codes: `PEER_LOST_EXIT` (150) is 128 or more, so that Kubeflow's
`restartPolicy: ExitCode` restarts the pod (it retries 128..255);
`MODEL_DIR_NOT_SHARED_EXIT` (78, EX_CONFIG) is a permanent error.
"""

import concurrent.futures
import faulthandler
import json
import os
import socket
import sys
import tempfile
import threading
import time

from clusterspec import config as tfc
from clusterspec.health_format import (  # noqa: F401  (the watchdog's names)
  MARKER_DIR,
  MODEL_DIR_NOT_SHARED_EXIT,
  PEER_LOST_EXIT,
)
from estimator_accum.distribution import stop_state
from estimator_accum.distribution.peers import (  # noqa: F401  (health's names)
  OUTLIVE_SECONDS,
  Peer,
  coordination_heartbeat,
  hosts_coordination_service,
  outlive_peers,
  peer_answers,
  refusing_peers,
  task_name,
  wait_until_training_tasks_end,
)

DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 5.0
# How long a peer may take to answer for the first time (a pod pulling its
# image, a slow scheduler) before it counts as lost.
DEFAULT_STARTUP_TIMEOUT = 600.0


def _say(message):
  sys.stderr.write(f"[tfconfig] {message}\n")
  sys.stderr.flush()


class _Markers:
  """The watchdog's marker files in `model_dir/.estimator_accum_tasks/`:
  this task's, rewritten every interval, and its peers', read (the
  `Watchdog`'s attributes: model_dir, task_type, index, name, timeout)."""

  def _marker(self, task_type, index):
    return os.path.join(self.model_dir, MARKER_DIR,
                        f"{task_type}-{index}.json")

  def _write_marker(self, state):
    if not self.model_dir or self.task_type not in tfc.TRAINING_TYPES:
      return
    import tensorflow as tf

    self._beat += 1
    path = self._marker(self.task_type, self.index)
    text = json.dumps({"state": state, "host": socket.gethostname(),
                       "pid": os.getpid(), "beat": self._beat})
    try:
      from estimator_accum import _files  # noqa: PLC0415  (as tf: lazily)

      tf.io.gfile.makedirs(os.path.dirname(path))
      _files.write_whole(path, text)
    except (tf.errors.OpError, OSError) as error:
      _say(f"{self.name}: cannot write {path}: {error}")

  def _read_marker(self, peer):
    import tensorflow as tf

    try:
      with tf.io.gfile.GFile(self._marker(peer.task_type, peer.index)) as f:
        return f.read()
    except (tf.errors.OpError, OSError):
      return None

  def _check_marker(self, peer, now):
    """Reads the peer's marker; exits if the model_dir is not shared."""
    text = self._read_marker(peer)
    if peer.marker_seen is None:
      peer.marker_seen = text if text is not None else ""
    elif text is not None and text != peer.marker_seen:
      peer.marker_changed = True
    # A task rewrites its marker when its watchdog starts, before it can
    # answer (the watchdog starts before the strategy's server): so "done"
    # read after an answer, or after a change, is this run's, not a stale
    # one of an earlier run in the same model_dir.
    fresh = peer.marker_changed or peer.first_answer is not None
    if fresh and text and '"state": "done"' in text:
      peer.done = True
      return
    if (not peer.marker_changed and peer.first_answer is not None and
        now - peer.first_answer > self.timeout):
      _say(f"{self.name}: model_dir {self.model_dir} is not the one "
           f"{peer.name} uses: {peer.name} answers at {peer.address} but "
           f"its marker {self._marker(peer.task_type, peer.index)} did not "
           f"change in {self.timeout:g} s; every task needs the same "
           "model_dir on storage all of them see (GCS, S3, NFS); exiting "
           f"with {MODEL_DIR_NOT_SHARED_EXIT}")
      self._exit(MODEL_DIR_NOT_SHARED_EXIT)


class Watchdog(_Markers):
  """Watches every other task of `config`; see the module docstring.

  Args:
    config: TF_CONFIG dict with "task" (as `tfconfig.from_environment`).
    model_dir: optional str, the job's shared model_dir (markers).
    timeout: seconds without an answer after which a peer is lost.
    interval: seconds between probes (and marker rewrites).
    startup_timeout: seconds a peer may take to answer the first time.
    exit: function(code), called to end the process (`os._exit`).
    stuck: optional function(seconds) -> bool: whether this task has been
      waiting for its peers for that long (inside a training step). Given,
      a lost peer ends this process only while it is stuck: a peer that
      left after training (a worker done while the chief evaluates) ends
      nothing. Without it, a lost peer always ends the process.
    stall_report: optional seconds (with `stuck`): a task stuck that long
      in one step while every peer answers says so once, in one line, with
      its main thread's stack (`stall_report_lines`), and trains on: a
      peer busy between steps (evaluating) and collectives that never meet
      look the same from here, and only the second is a fault.
  """

  def __init__(self, config, model_dir=None, timeout=DEFAULT_TIMEOUT,
               interval=DEFAULT_INTERVAL,
               startup_timeout=DEFAULT_STARTUP_TIMEOUT, exit=os._exit,
               stuck=None, stall_report=None):
    _check_seconds(timeout=timeout, interval=interval,
                   startup_timeout=startup_timeout,
                   **({} if stall_report is None else
                      {"stall_report": stall_report}))
    if interval > timeout:
      raise ValueError(f"interval ({interval}) must not exceed timeout "
                       f"({timeout})")
    task = config[tfc.TASK]
    self.task_type, self.index = task[tfc.TYPE], int(task[tfc.INDEX])
    self.name = task_name(self.task_type, self.index)
    self.model_dir = model_dir
    self.timeout, self.interval = float(timeout), float(interval)
    self.startup_timeout = max(float(startup_timeout), self.timeout)
    self._exit = exit
    self._stuck = stuck
    self._stall = _StallReport(stall_report, stuck)
    now = time.monotonic()
    self.peers = [
        Peer(task_type, index, config[tfc.CLUSTER][task_type][index], now)
        for task_type, index in tfc.tasks(config)
        if task_type != tfc.EVALUATOR and
        (task_type, index) != (self.task_type, self.index)]
    self._beat = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, daemon=True,
                                    name="tfconfig-peer-watchdog")
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, len(self.peers)))

  # The loop ---------------------------------------------------------------

  def start(self):
    if not self._thread.is_alive() and not self._stop.is_set():
      self._write_marker("running")
      self._thread.start()
      _STARTED.append(self)
    return self

  def finish(self):
    """This task ended normally: peers stop watching it.

    Without parameter servers, the training tasks then leave together:
    this one waits until every other has marked itself done (or is lost,
    or `startup_timeout` has passed). TensorFlow's coordination service,
    which the chief hosts, logs errors on whichever task outlives another
    by a heartbeat ("heartbeat timeout" on the chief, "failed to connect to
    all addresses" on a worker), though the job succeeded.
    """
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=self.interval + 5)
    self._write_marker("done")
    if self.model_dir and not any(p.task_type == tfc.PS for p in self.peers):
      self._leave_together()
      if hosts_coordination_service(self.task_type, self.index,
                                     self.peers):
        outlive_peers(self.peers)

  def _leave_together(self):
    pending = [peer for peer in self.peers
               if peer.task_type in tfc.TRAINING_TYPES and not peer.done]
    deadline = time.monotonic() + self.startup_timeout
    next_probe = time.monotonic()
    while pending and time.monotonic() < deadline:
      now = time.monotonic()
      for peer in pending:
        self._check_marker(peer, now)
      if now >= next_probe:
        next_probe = now + self.interval
        for peer in pending:
          if peer.done:
            continue
          # An answer also makes its "done", seen now or next, this run's.
          peer.record(peer.probe(min(self.interval * 2, self.timeout)),
                      time.monotonic())
          if (peer.last_answer is None or
              time.monotonic() - peer.last_answer > self.timeout):
            peer.done = True  # Gone: nothing to wait for.
      pending = [peer for peer in pending if not peer.done]
      if pending:
        time.sleep(0.2)

  def peers_answered(self):
    """Counts every peer as having answered now: for a watchdog started
    once the cluster is known to be up (a strategy connected to every
    task), so that a peer lost before the first probe counts from now,
    not from `startup_timeout`."""
    now = time.monotonic()
    for peer in self.peers:
      peer.record(None, now)
    return self

  def watching(self):
    """Whether it is watching (started, not finished or stopped)."""
    return self._thread.is_alive() and not self._stop.is_set()

  def stop(self):
    """Stops watching without marking this task done (it failed)."""
    self._stop.set()

  def __enter__(self):
    return self.start()

  def __exit__(self, exc_type, exc, traceback):
    if exc_type is None or issubclass(exc_type, SystemExit) and not (
        exc and exc.code):
      self.finish()
    else:
      self.stop()

  def _loop(self):
    while not self._stop.wait(self.interval):
      self._round()

  def _round(self):
    watched = [peer for peer in self.peers if not peer.done]
    deadline = min(self.interval * 2, self.timeout)
    futures = {peer: self._pool.submit(peer.probe, deadline)
               for peer in watched}
    now = time.monotonic()
    for peer, future in futures.items():
      error = future.result()
      if self._stop.is_set():
        return
      now = time.monotonic()
      peer.record(error, now)
      if self.model_dir and peer.task_type in tfc.TRAINING_TYPES:
        self._check_marker(peer, now)
        if peer.done:
          continue
      self._check_alive(peer, now)
    self._stall.check(self.name, watched, now, 2 * self.interval)
    self._write_marker("running")
    if self.task_type == tfc.PS and self.model_dir and all(
        peer.done for peer in self.peers
        if peer.task_type in tfc.TRAINING_TYPES) and not _stop_serving():
      _say(f"{self.name}: every training task has finished; exiting")
      self._exit(0)

  def _check_alive(self, peer, now):
    if peer.last_answer is None:
      silent, limit = now - peer.started, self.startup_timeout
    else:
      silent, limit = now - peer.last_answer, self.timeout
    if silent < limit:
      return
    if self._stuck is not None and not self._stuck(self.timeout):
      return  # Not waiting for it: a peer gone after training ends nothing.
    never = " (it never answered)" if peer.last_answer is None else ""
    _say(f"{self.name}: lost {peer.name} at {peer.address}: no answer for "
         f"{silent:.0f} s{never} ({peer.last_error}); exiting with "
         f"{PEER_LOST_EXIT}")
    self._exit(PEER_LOST_EXIT)


def _check_seconds(**values):
  """ValueError naming the first of `values` that is not seconds > 0."""
  for name, value in values.items():
    if not isinstance(value, (int, float)) or not value > 0:
      raise ValueError(f"{name} must be a number of seconds > 0, got "
                       f"{value!r}")


class _StallReport:
  """A Watchdog's `stall_report`: says once that its task has been inside
  one step for `seconds` while every peer answered within the last
  `answered_within` seconds (`stall_report_lines`); ends nothing."""

  def __init__(self, seconds, stuck):
    self.seconds, self._stuck, self._said = seconds, stuck, False

  def check(self, name, watched, now, answered_within):
    if (self._said or self.seconds is None or self._stuck is None or
        not self._stuck(self.seconds)):
      return
    if any(peer.last_answer is None or
           now - peer.last_answer > answered_within for peer in watched):
      return  # A silent peer: Watchdog._check_alive's, not this line's.
    self._said = True
    sys.stderr.write("".join(
        f"[tfconfig] {line}\n" for line in stall_report_lines(
            name, self.seconds)))
    sys.stderr.flush()


def stall_report_lines(name, seconds):
  """The lines a task stuck in one step while every peer answers says:
  what it sees, then where its main thread waits (inside `session.run`,
  and where that was called from: what a report needs), innermost first."""
  lines = [f"{name}: inside one training step for {seconds:g} s or more "
           f"while every peer answers: it waits for a peer's part of the "
           f"step (a peer busy between steps, e.g. evaluating, or "
           f"collectives that do not match). Training goes on; this is "
           f"said once. Its main thread waits in:"]
  return lines + [f"  {line.strip()}" for line in main_thread_stack()]


def main_thread_stack():
  """The main thread's frames, innermost first, as faulthandler writes
  them ('File "...", line N in name'); [] where it cannot."""
  with tempfile.TemporaryFile("w+") as dump:
    try:
      faulthandler.dump_traceback(dump, all_threads=True)
    except (OSError, ValueError, RuntimeError):
      return []
    dump.seek(0)
    text = dump.read()
  main = f"0x{threading.main_thread().ident:016x}"
  stack, inside = [], False
  for line in text.splitlines():
    if line.startswith(("Thread ", "Current thread ")):
      inside = main in line
    elif inside and line.strip():
      stack.append(line)
  return stack


def _stop_serving():
  """Whether a SIGTERM stop of estimator_accum serves the variables in this
  process: its own thread ends the process, with 143, once the training
  tasks have gone (the job was stopped, not finished)."""
  return stop_state.stopping()


# The watchdogs started in this process (`running` reads it).
_STARTED = []


def running():
  """Whether a watchdog of this process is watching its peers."""
  return any(watchdog.watching() for watchdog in _STARTED)


def seconds_to_notice():
  """The longest a watchdog of this process takes to end it for a lost
  peer (its timeout and two probes), or None when none watches."""
  times = [watchdog.timeout + 2 * watchdog.interval
           for watchdog in _STARTED if watchdog.watching()]
  return max(times) if times else None


def watch(model_dir=None, timeout=DEFAULT_TIMEOUT, interval=DEFAULT_INTERVAL,
          startup_timeout=DEFAULT_STARTUP_TIMEOUT, config=None):
  """A started `Watchdog` for this process's TF_CONFIG, or None when the
  process is not part of a cluster (no TF_CONFIG, no task, or an
  evaluator). Use it as a context manager around training, or call
  `finish()` when training has ended."""
  config = config if config is not None else tfc.from_environment()
  task = config.get(tfc.TASK) if config else None
  if not task or task.get(tfc.TYPE) == tfc.EVALUATOR:
    return None
  if len(tfc.tasks(config)) < 2:
    return None
  return Watchdog(config, model_dir=model_dir, timeout=timeout,
                  interval=interval, startup_timeout=startup_timeout).start()
