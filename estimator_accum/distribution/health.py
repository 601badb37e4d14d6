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
import json
import os
import socket
import sys
import threading
import time

from clusterspec import config as tfc
from clusterspec.health_format import (  # noqa: F401  (the watchdog's names)
  MARKER_DIR,
  MODEL_DIR_NOT_SHARED_EXIT,
  PEER_LOST_EXIT,
)
from estimator_accum import tf_private
from estimator_accum.distribution import stop_state

DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 5.0
# How long a peer may take to answer for the first time (a pod pulling its
# image, a slow scheduler) before it counts as lost.
DEFAULT_STARTUP_TIMEOUT = 600.0
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"


def _say(message):
  sys.stderr.write(f"[tfconfig] {message}\n")
  sys.stderr.flush()


def _name(task_type, index):
  return f"{task_type}:{index}"


# How long the coordination service's host waits, at the end of a job,
# for the other training tasks' processes to go.
OUTLIVE_SECONDS = 15.0


def _coordination_leader(task_types):
  """The task that hosts TensorFlow's coordination service in a cluster of
  chief and workers with these `task_types`: the chief, else worker 0."""
  return (tfc.CHIEF if tfc.CHIEF in task_types else tfc.WORKER), 0


class _Peer:
  """One other task: its address, its channel and what we know of it."""

  def __init__(self, task_type, index, address, now):
    import grpc  # TensorFlow's own dependency; imported where it is used.

    self.task_type, self.index, self.address = task_type, index, address
    self.name = _name(task_type, index)
    self.channel = grpc.insecure_channel(address)
    self.get_status = self.channel.unary_unary(
        _GET_STATUS, request_serializer=lambda _: b"",
        response_deserializer=lambda data: data)
    self.started = now
    self.first_answer = None     # monotonic time of the first answer
    self.last_answer = None      # ... and of the last one
    self.last_error = "no answer yet"
    self.marker_seen = None      # the marker's text when it was first read
    self.marker_changed = False  # it changed since: it is this run's
    self.done = False

  def record(self, error, now):
    """Keeps a probe's outcome: None (it answered) or the error's name."""
    if error is None:
      if self.first_answer is None:
        self.first_answer = now
      self.last_answer = now
    else:
      self.last_error = error

  def probe(self, deadline):
    import grpc

    try:
      self.get_status(None, timeout=deadline)
      return None
    except grpc.RpcError as error:
      return error.code().name.lower().replace("_", " ")


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
      tf.io.gfile.makedirs(os.path.dirname(path))
      temporary = f"{path}.{os.getpid()}.tmp"
      with tf.io.gfile.GFile(temporary, "w") as writer:
        writer.write(text)
      tf.io.gfile.rename(temporary, path, overwrite=True)
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
  """

  def __init__(self, config, model_dir=None, timeout=DEFAULT_TIMEOUT,
               interval=DEFAULT_INTERVAL,
               startup_timeout=DEFAULT_STARTUP_TIMEOUT, exit=os._exit,
               stuck=None):
    for name, value in (("timeout", timeout), ("interval", interval),
                        ("startup_timeout", startup_timeout)):
      if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got "
                         f"{value!r}")
    if interval > timeout:
      raise ValueError(f"interval ({interval}) must not exceed timeout "
                       f"({timeout})")
    task = config[tfc.TASK]
    self.task_type, self.index = task[tfc.TYPE], int(task[tfc.INDEX])
    self.name = _name(self.task_type, self.index)
    self.model_dir = model_dir
    self.timeout, self.interval = float(timeout), float(interval)
    self.startup_timeout = max(float(startup_timeout), self.timeout)
    self._exit = exit
    self._stuck = stuck
    now = time.monotonic()
    self.peers = [
        _Peer(task_type, index, config[tfc.CLUSTER][task_type][index], now)
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
      if _hosts_coordination_service(self.task_type, self.index,
                                     self.peers):
        _outlive_peers(self.peers)

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


def coordination_heartbeat(seconds, config=None):
  """Sets how long TensorFlow's coordination service waits for a task's
  heartbeat (10 s by default) in this process; call it before
  MultiWorkerMirroredStrategy is made, which then keeps it.

  On a slow link a task's heartbeats can wait behind a large all-reduce:
  measured, MiniLM's window on 2 workers at 250 Mbit/s ended 2 jobs in 3
  with "heartbeat timeout". The watchdog (`watch`) tells a lost peer from
  a slow one by its own timeout; the heartbeat's should be as long.
  TensorFlow 2.15 has no public call for it (`configure_coordination_service`
  of its eager context, which the strategy itself calls).

  Args:
    seconds: float > 0.
    config: TF_CONFIG dict; default this process's.

  Returns:
    Whether it was set: False outside a cluster of chief and workers (the
    strategy configures no service for an evaluator or with parameter
    servers), or when the service is already configured.
  """

  if not isinstance(seconds, (int, float)) or not seconds > 0:
    raise ValueError(f"seconds must be a number > 0, got {seconds!r}")
  config = config if config is not None else tfc.from_environment()
  cluster = (config or {}).get(tfc.CLUSTER, {})
  task = (config or {}).get(tfc.TASK, {})
  if (task.get(tfc.TYPE) not in tfc.TRAINING_TYPES or tfc.PS in cluster or
      tf_private.coordination_service_configured()):
    return False
  leader, index = _coordination_leader(cluster)
  tf_private.configure_coordination_service(
      f"/job:{leader}/replica:0/task:{index}", seconds * 1000,
      [(job, len(cluster[job])) for job in tfc.TRAINING_TYPES
       if job in cluster])
  return True


def _stop_serving():
  """Whether a SIGTERM stop of estimator_accum serves the variables in this
  process: its own thread ends the process, with 143, once the training
  tasks have gone (the job was stopped, not finished)."""
  return stop_state.stopping()


def _hosts_coordination_service(task_type, index, peers):
  """Whether this task hosts TensorFlow's coordination service: the
  chief, or worker 0 of a cluster without one."""
  types = {p.task_type for p in peers} | {task_type}
  return (task_type, index) == _coordination_leader(types)


def _outlive_peers(peers, seconds=None):
  """The coordination service's host leaves after the other training
  tasks have gone (their servers stop answering), for at most `seconds`
  (default OUTLIVE_SECONDS): a task whose service is gone while it still
  shuts down logs "failed to connect to all addresses", although the job
  succeeded. Returns whether every one has gone."""
  deadline = time.monotonic() + (OUTLIVE_SECONDS if seconds is None
                                 else seconds)
  alive = [p for p in peers if p.task_type in tfc.TRAINING_TYPES]
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if p.probe(1.0) is None]
    if alive:
      time.sleep(0.2)
  return not alive


def wait_until_training_tasks_end(config, seconds):
  """Waits until no training task (chief, worker) of `config` but this one
  answers (each has exited), for at most `seconds`; whether none does.
  A parameter server told to stop serves the variables until then."""
  task = config[tfc.TASK]
  me = (task[tfc.TYPE], int(task[tfc.INDEX]))
  now = time.monotonic()
  peers = [_Peer(task_type, index, config[tfc.CLUSTER][task_type][index],
                 now)
           for task_type, index in tfc.tasks(config)
           if task_type in tfc.TRAINING_TYPES and (task_type, index) != me]
  return _outlive_peers(peers, seconds)


# The watchdogs started in this process (`running` reads it).
_STARTED = []


def peer_answers(config, deadline=1.0):
  """{"type:index": None if it answered, else the error's name} for the
  other chief and worker tasks of `config` (a TF_CONFIG dict with "task"):
  one GetStatus each, on a channel of its own, within `deadline` seconds.
  A task that has exited (or whose host has) fails at once with
  "unavailable"; a frozen one, whose port still accepts, with "deadline
  exceeded"; a live one answers from its server's threads, whatever its
  Python code is doing."""
  task = config[tfc.TASK]
  this = (task[tfc.TYPE], int(task[tfc.INDEX]))
  answers = {}
  for task_type, index in tfc.tasks(config):
    if task_type not in tfc.TRAINING_TYPES or (task_type, index) == this:
      continue
    peer = _Peer(task_type, index, config[tfc.CLUSTER][task_type][index],
                 time.monotonic())
    try:
      answers[peer.name] = peer.probe(deadline)
    finally:
      peer.channel.close()
  return answers


def refusing_peers(config, deadline=1.0):
  """The other chief and worker tasks of `config` (a TF_CONFIG dict with
  "task") whose address refuses a connection now: tasks that have exited,
  or whose host has (`peer_answers`' "unavailable"); a frozen task, whose
  port still accepts, and a slow one answer or time out, and are not
  named.

  Returns:
    list of "type:index" names.
  """
  return [name for name, error in peer_answers(config, deadline).items()
          if error == "unavailable"]


def running():
  """Whether a watchdog of this process is watching its peers."""
  return any(watchdog.watching() for watchdog in _STARTED)


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
