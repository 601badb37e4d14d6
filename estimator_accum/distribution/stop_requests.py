"""A parameter-server job's stop requests: one counter on ps task 0.

Under MultiWorkerMirroredStrategy every micro-batch all-reduces the stop
flag (`preemption`). A parameter-server job has no collective its tasks
all run, and its tasks train asynchronously. So the request travels
through the parameter servers instead: an int64 counter on
`/job:ps/task:0`, a resource variable in no collection (never saved,
never initialized by a task's init op; 0 until first asked). Every
training task reads it beside each micro-batch's stop flag and stops once
it has grown past the value it read first; a task told to stop, a
training task or a parameter server, adds one to it through a session of
its own to its own server. The first value read is the baseline: a count
left by an earlier stop (a parameter server that kept running while the
training tasks were started again) stops nothing.

A parameter server builds no train op: `serving_config` tells `preemption`
to take SIGTERM when it is imported there, and `wait_for_training_to_end`
keeps it serving the variables until the chief's save has ended.
"""

import threading

import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum.distribution import health

DEVICE = "/job:ps/task:0"
SHARED_NAME = "estimator_accum_stop_requests"
POST_TIMEOUT_SECONDS = 5.0


def _config_of(types):
  """This process's TF_CONFIG when the cluster has ps tasks and this task
  is of one of `types`; else None (no TF_CONFIG, a bad one, no ps)."""
  config = tfc.task_of(types)
  if config is None or tfc.PS not in config.get(tfc.CLUSTER, {}):
    return None
  return config


def training_config():
  """TF_CONFIG of a chief or worker of a parameter-server job, or None."""
  return _config_of(tfc.TRAINING_TYPES)


def serving_config():
  """TF_CONFIG of a parameter server, or None."""
  return _config_of((tfc.PS,))


def saves_checkpoints():
  """Whether this task saves the job's checkpoints: every task but a
  parameter-server job's workers (there the chief saves)."""
  config = training_config()
  return config is None or config[tfc.TASK][tfc.TYPE] == tfc.CHIEF


def _handle():
  return tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[], container="",
                                shared_name=SHARED_NAME, name="stop_requests")


def read():
  """In a training task's graph: the requests so far (an int64 scalar
  read from ps task 0; 0 before the first)."""
  with tf.device(DEVICE):
    handle = _handle()
    return tf.cond(
        tf.raw_ops.VarIsInitializedOp(resource=handle),
        lambda: tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64),
        lambda: tf.constant(0, tf.int64), name="stop_requests_read")


def post(config, timeout_seconds=POST_TIMEOUT_SECONDS):
  """Adds one request, through this task's own server (a session that
  reaches ps task 0 only). Returns None, or what went wrong in one line,
  within `timeout_seconds` (a session's creation waits for ps task 0
  without end: it is left waiting in a daemon thread)."""
  task = config[tfc.TASK]
  address = config[tfc.CLUSTER][task[tfc.TYPE]][int(task[tfc.INDEX])]
  outcome = []
  thread = threading.Thread(target=_post, args=(address, outcome),
                            daemon=True, name="estimator_accum_stop_request")
  thread.start()
  thread.join(timeout_seconds)
  if not outcome:
    return f"no answer from {DEVICE} within {timeout_seconds:g} s"
  return outcome[0]


def _post(address, outcome):
  graph = tf.Graph()
  with graph.as_default(), tf.device(DEVICE):
    handle = _handle()
    initialized = tf.raw_ops.VarIsInitializedOp(resource=handle)
    one = tf.constant(1, tf.int64)
    first = tf.raw_ops.AssignVariableOp(resource=handle, value=one)
    another = tf.raw_ops.AssignAddVariableOp(resource=handle, value=one)
  try:
    with tf.compat.v1.Session(f"grpc://{address}", graph=graph,
                              config=tf.compat.v1.ConfigProto(
                                  device_filters=[DEVICE])) as session:
      # Two tasks asking at once may both find it uninitialized: both
      # set 1, and the training tasks, which read 0 first, still stop.
      session.run(another if session.run(initialized) else first)
  except tf.errors.OpError as error:
    outcome.append(
        f"{type(error).__name__}: {error.message.splitlines()[0]}")
    return
  outcome.append(None)


def wait_for_training_to_end(config, seconds):
  """Waits until no chief or worker of `config` answers (each has saved,
  or stopped, and exited), for at most `seconds`; whether they all did."""
  return health.wait_until_training_tasks_end(config, seconds)
