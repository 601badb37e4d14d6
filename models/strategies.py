"""The distribution strategy the three scripts run under, chosen one way.

`choose(name, model_dir, peer_timeout_secs)` reads TF_CONFIG for the
cluster strategies (rewritten into TensorFlow's form first, so that what
Kubeflow, Vertex AI or SageMaker set is read as Estimator reads it), starts
the peer watchdog before the strategy (making it waits for every peer), and
returns one `Distribution`. `run_classifier.py`, `python -m models.mnist`
and `python -m models.housing` all call it.
"""

import dataclasses

import tensorflow as tf

import tfconfig
from clusterspec import config as clusterspec
from estimator_accum import releases
from estimator_accum.distribution import health

NAMES = ("none", "mirrored", "multi_worker", "parameter_server")
_CLUSTER = ("multi_worker", "parameter_server")


class StrategyError(ValueError):
  """A strategy that cannot run with this TF_CONFIG; the message says why."""


@dataclasses.dataclass(frozen=True)
class Distribution:
  """How the job is spread.

  Attributes:
    name: one of NAMES.
    strategy: the tf.distribute strategy for Estimator's train_distribute,
      or None (one device; parameter-server workers are placed by Estimator).
    workers: training tasks (the chief and the workers), 1 without a cluster.
    replicas_per_worker: replicas each training task runs.
    tf_config: TF_CONFIG as TensorFlow reads it ({} without a cluster).
    watchdog: the started peer watchdog (estimator_accum.distribution.health), or None.
  """

  name: str
  strategy: object
  workers: int
  replicas_per_worker: int
  tf_config: dict
  watchdog: object = None

  @property
  def task(self):
    """This task's {"type", "index"} ({} without a cluster)."""
    return self.tf_config.get("task", {})

  @property
  def is_chief(self):
    """Whether this task writes the evaluation and the summaries: the
    chief, else worker 0 of a cluster with no chief, else the only task."""
    task = self.task
    return task.get("type", "chief") == "chief" or (
        task.get("type") == "worker" and task.get("index") == 0 and not
        self.tf_config.get("cluster", {}).get("chief"))

  def trainer_shard(self):
    """(trainers, this trainer's index) over the chief and the workers."""
    task = self.task
    return clusterspec.trainer_position(self.tf_config.get("cluster", {}),
                                        task.get("type"),
                                        task.get("index", 0))

  def finish(self):
    """At the job's end: leaves together with the peers (watchdog)."""
    if self.watchdog:
      self.watchdog.finish()

  def stop(self):
    """On a failure: stops watching the peers."""
    if self.watchdog:
      self.watchdog.stop()


def _multi_worker_mirrored():
  """TF 2's MultiWorkerMirroredStrategy where Estimator trains with it
  (2.15); on 2.16+, where the library's sessions train (SessionEstimator),
  tf.compat.v1's, whose collective ops serve graph sessions."""
  if releases.estimator() is not None:
    return tf.distribute.MultiWorkerMirroredStrategy()
  return tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()


def tf_config(name):
  """TF_CONFIG as a checked dict in TensorFlow's form ({} when unset), for
  the strategy `name`; StrategyError naming the problem otherwise."""
  try:
    return tfconfig.use_environment(name if name in _CLUSTER else None)
  except tfconfig.TFConfigError as error:
    raise StrategyError(str(error)) from None


def choose(name, model_dir, peer_timeout_secs=None):
  """The `Distribution` of strategy `name` (one of NAMES).

  Args:
    name: "none", "mirrored", "multi_worker" or "parameter_server".
    model_dir: the directory every task shares (the watchdog's markers).
    peer_timeout_secs: float > 0: in a cluster, a peer silent this long
      ends the task (exit 150) instead of a hang; None or 0: no watchdog.

  Raises:
    StrategyError: a cluster strategy without a cluster in TF_CONFIG, or
      parameter servers without ps tasks.
  """
  if name not in NAMES:
    raise StrategyError(f"unknown strategy {name!r}; one of {list(NAMES)}.")
  if name == "none":
    return Distribution(name, None, 1, 1, {})
  if name == "mirrored":
    strategy = tf.distribute.MirroredStrategy()
    return Distribution(name, strategy, 1, strategy.num_replicas_in_sync, {})
  config = tf_config(name)
  cluster = config.get("cluster", {})
  workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
  if not workers:
    raise StrategyError(f"--distribution_strategy={name} needs TF_CONFIG "
                        "with a cluster (see python -m tfconfig print).")
  if name == "parameter_server" and not cluster.get("ps"):
    raise StrategyError("--distribution_strategy=parameter_server needs ps "
                        "tasks in TF_CONFIG's cluster.")
  watchdog = None
  if peer_timeout_secs:
    # Before the strategy: making it waits for every peer.
    watchdog = health.watch(
        model_dir, timeout=peer_timeout_secs,
        interval=min(5.0, peer_timeout_secs))
  try:
    if name == "parameter_server":
      return Distribution(name, None, workers, 1, config, watchdog)
    # Slow is not dead: TensorFlow's own heartbeat waits as long as the
    # watchdog (10 s at least, its default).
    health.coordination_heartbeat(
        max(peer_timeout_secs or 0, 10.0), config)
    strategy = _multi_worker_mirrored()
    return Distribution(name, strategy, workers,
                        strategy.num_replicas_in_sync // workers, config,
                        watchdog)
  except BaseException:
    if watchdog:
      watchdog.stop()
    raise
