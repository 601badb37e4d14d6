"""Every worker's checkpoint starts after every worker's last step.

Under MultiWorkerMirroredStrategy a checkpoint reads the window's per-replica
state across workers: a collective that every worker's save joins (each
worker saves, the others into `model_dir/tmp_worker_<i>`). When a job ends
with its input, each worker's last step fails with OutOfRangeError, and
TensorFlow aborts the collectives of that worker while the step ends. A
save collective another worker had already started towards it was aborted
with it (`Delete called on non-empty BufRendezvous`, then `UnavailableError`
on the other side): measured, 3 jobs in 15 on 2 workers, 3 in 6 with the
chief slower.

So every save reads the window's state only after a barrier: each worker
writes a marker file for the save into `model_dir/.estimator_accum_saves/`
and waits until every worker's marker is there. A worker reaches its save
only after its own last step has returned, so when the barrier opens no
worker's last step is still running, and no collective of the save can be
aborted by one. A barrier is named by the global step and by how many saves
this process made at that step, which every worker counts alike. The
model_dir must be shared by the workers, as Estimator needs it to be for
them to resume from the chief's checkpoints.

Outside a multi-worker collective strategy nothing changes.
"""

import collections
import json
import os
import re
import threading
import time

import tensorflow as tf

from estimator_accum import graph_state, tf_private
from estimator_accum.distribution import watchdog, workers

# How long a save waits for the other workers to reach it: a worker that
# never does has died, or does not see this model_dir.
BARRIER_TIMEOUT_SECONDS = 30 * 60
BARRIER_DIRECTORY = ".estimator_accum_saves"
_POLL_SECONDS = 0.05
_SAVEABLE_KEY = "VARIABLE_VALUE"
# A non-chief worker of MultiWorkerMirroredStrategy saves into this
# subdirectory of model_dir.
_WORKER_SUBDIRECTORY = re.compile(r"^tmp_[a-z]+_\d+$")


class SaveBarrier:
  """The barrier every save of one worker passes before reading the window
  across workers."""

  def __init__(self, tasks, task, timeout_seconds=BARRIER_TIMEOUT_SECONDS):
    self._tasks, self._task = tasks, task
    self._timeout_seconds = timeout_seconds
    self._lock = threading.Lock()
    self._saves_at_step = collections.Counter()
    self._previous_marker = None

  def wait(self, step, checkpoint_prefix):
    """Returns `step` once every worker has reached the same save."""
    step = int(step)
    directory = _model_dir(checkpoint_prefix)
    with self._lock:
      self._saves_at_step[step] += 1
      name = f"step_{step}_save_{self._saves_at_step[step]}"
    barrier = os.path.join(directory, BARRIER_DIRECTORY)
    tf.io.gfile.makedirs(barrier)
    if self._previous_marker is None:
      self._remove_markers_of_an_earlier_run(barrier)
    marker = os.path.join(barrier, f"{name}.{self._task}")
    with tf.io.gfile.GFile(marker, "w") as f:
      f.write(json.dumps({"step": step, "task": self._task}))
    deadline = time.monotonic() + self._timeout_seconds
    expected = [os.path.join(barrier, f"{name}.{t}") for t in self._tasks]
    while not all(tf.io.gfile.exists(path) for path in expected):
      if time.monotonic() > deadline:
        missing = [t for t, p in zip(self._tasks, expected)
                   if not tf.io.gfile.exists(p)]
        raise RuntimeError(
            f"checkpoint at step {step}: {', '.join(missing)} did not reach "
            f"it within {self._timeout_seconds:g} s (no marker in "
            f"{barrier}); every worker must see the same model_dir")
      time.sleep(_POLL_SECONDS)
    # Every worker has passed the previous barrier to reach this one.
    if self._previous_marker:
      tf.io.gfile.remove(self._previous_marker)
    self._previous_marker = marker
    return step

  def _remove_markers_of_an_earlier_run(self, barrier):
    """Removes this worker's marker left by an earlier run of the job in
    this model_dir (the last barrier it passed). Its save counts restart
    with this process, and a later save of the same name would otherwise
    find it there. The first save of a process (at the restored step, before
    any step has run) is the only one that may still see another worker's
    old marker, and it follows no last step to wait for."""
    for name in tf.io.gfile.listdir(barrier):
      if name.endswith(f".{self._task}"):
        tf.io.gfile.remove(os.path.join(barrier, name))


def _model_dir(checkpoint_prefix):
  """The model_dir of a checkpoint prefix, for the chief's and for a
  worker's (`model_dir/tmp_worker_1/model.ckpt`) alike."""
  if isinstance(checkpoint_prefix, bytes):
    checkpoint_prefix = checkpoint_prefix.decode()
  directory = os.path.dirname(checkpoint_prefix)
  if _WORKER_SUBDIRECTORY.match(os.path.basename(directory)):
    directory = os.path.dirname(directory)
  return directory


# Process-wide by nature: a barrier counts the saves this process made at
# each step, across the graphs Estimator builds (one per train() call), so
# that every worker names the same save alike. Keyed by the cluster.
_BARRIERS = {}


def order_saves(variable, global_step=None):
  """Makes every save of `variable` (per-replica window state) read it
  across workers only once every worker has reached that save.

  `global_step`: the counter naming each save's barrier (the same on every
  worker at a save), or None for the graph's global step, if any.

  A no-op outside a multi-worker collective strategy.
  """
  cluster = workers.training_tasks()
  if cluster is None:
    return
  tasks, task = cluster
  barrier = _BARRIERS.setdefault((tuple(tasks), task), SaveBarrier(tasks, task))
  if global_step is None:
    global_step = tf.compat.v1.train.get_global_step()
  factories = tf_private.saveable_factories(variable)

  def ordered_gather():
    factory = factories[_SAVEABLE_KEY]

    def ordered_factory(*args, **kwargs):
      return tf_private.map_saveable_tensors(
          factory(*args, **kwargs),
          lambda tensor: _after_barrier(tensor, global_step, barrier))

    return dict(factories, **{_SAVEABLE_KEY: ordered_factory})

  # The instance's own method, as the Saver asks each variable for it.
  tf_private.replace_saveable_factories(variable, ordered_gather)


def _after_barrier(tensor, global_step, barrier):
  """A callable making `tensor` (a tensor or a callable making one) after
  the save barrier, in the graph being saved."""

  def make():
    prefix = _checkpoint_prefix()
    if prefix is None:  # Not a name-based Saver's save: nothing to order.
      return tensor() if callable(tensor) else tensor
    passed, reads = _barrier_op(barrier, global_step, prefix)
    with tf.control_dependencies([passed]):
      value = tensor() if callable(tensor) else tensor
      if not watchdog.armed():
        return tf.identity(value)
      # The default peer watchdog counts the save's reads, which cross
      # workers, as waits: a peer lost during them ends this task too.
      reads[0] += 1
      return watchdog.ended(value)

  return make


def _barrier_op(barrier, global_step, prefix):
  """(the one barrier op of the save fed through `prefix`, which every
  window variable's read in that save waits for; [the number of those
  reads the default peer watchdog counts])."""
  ops = graph_state.owned("save_barriers", dict)
  if prefix.name not in ops:
    step = (tf.constant(0, tf.int64) if global_step is None else
            tf.cast(global_step.read_value(), tf.int64))
    reads = [0]
    ops[prefix.name] = (tf.numpy_function(
        watchdog.entering(barrier.wait, lambda: reads[0]), [step, prefix],
        tf.int64, stateful=True, name="save_barrier"), reads)
  return ops[prefix.name]


def _checkpoint_prefix():
  """The string tensor a tf.compat.v1.train.Saver being built is fed its
  checkpoint prefix through (`<its name scope>/Const:0`), or None."""
  graph = tf.compat.v1.get_default_graph()
  scope = graph.get_name_scope().split("/")[0]
  try:
    prefix = graph.get_tensor_by_name(f"{scope}/Const:0")
  except KeyError:
    return None
  return prefix if prefix.dtype == tf.string else None
