"""The other tasks of a TF_CONFIG cluster as this one reaches them: each
peer's status asked over gRPC (`WorkerService/GetStatus`, which
TensorFlow's own servers answer), which peers answer or refuse, waiting for
the training tasks to go, and the coordination service's host and
heartbeat. The watchdog that acts on them is `health.py`'s.
"""

import time

from clusterspec import config as tfc
from estimator_accum import runtime_private

__all__ = ["OUTLIVE_SECONDS", "Peer", "coordination_heartbeat",
           "coordination_leader", "hosts_coordination_service",
           "outlive_peers", "peer_answers", "refusing_peers", "task_name",
           "wait_until_training_tasks_end"]

GET_STATUS = "/tensorflow.WorkerService/GetStatus"


def task_name(task_type, index):
  """"type:index", as the lines name a task."""
  return f"{task_type}:{index}"


# How long the coordination service's host waits, at the end of a job,
# for the other training tasks' processes to go.
OUTLIVE_SECONDS = 15.0


def coordination_leader(task_types):
  """The task that hosts TensorFlow's coordination service in a cluster of
  chief and workers with these `task_types`: the chief, else worker 0."""
  return (tfc.CHIEF if tfc.CHIEF in task_types else tfc.WORKER), 0


class Peer:
  """One other task: its address, its channel and what we know of it."""

  def __init__(self, task_type, index, address, now):
    import grpc  # TensorFlow's own dependency; imported where it is used.

    self.task_type, self.index, self.address = task_type, index, address
    self.name = task_name(task_type, index)
    self.channel = grpc.insecure_channel(address)
    self.get_status = self.channel.unary_unary(
        GET_STATUS, request_serializer=lambda _: b"",
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
      runtime_private.coordination_service_configured()):
    return False
  leader, index = coordination_leader(cluster)
  runtime_private.configure_coordination_service(
      f"/job:{leader}/replica:0/task:{index}", seconds * 1000,
      [(job, len(cluster[job])) for job in tfc.TRAINING_TYPES
       if job in cluster])
  return True


def hosts_coordination_service(task_type, index, peers):
  """Whether this task hosts TensorFlow's coordination service: the
  chief, or worker 0 of a cluster without one."""
  types = {p.task_type for p in peers} | {task_type}
  return (task_type, index) == coordination_leader(types)


def outlive_peers(peers, seconds=None):
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
  peers = [Peer(task_type, index, config[tfc.CLUSTER][task_type][index],
                 now)
           for task_type, index in tfc.tasks(config)
           if task_type in tfc.TRAINING_TYPES and (task_type, index) != me]
  return outlive_peers(peers, seconds)


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
    peer = Peer(task_type, index, config[tfc.CLUSTER][task_type][index],
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
