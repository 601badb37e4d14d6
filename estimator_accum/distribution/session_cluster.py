"""Where a training session of the library's SessionEstimator runs: in
this process; under tf.compat.v1's MultiWorkerMirroredStrategy, on this
task's server in the strategy's cluster; or in a parameter-server job
(between-graph, as Estimator runs one), on this task's own server with the
variables placed on the ps tasks (the session's target and config, the
graph's device function, this worker's place among the input pipelines,
whether it is the chief, where it saves)."""

import dataclasses
import os
import typing

import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum.checkpoints import saver_hook
from estimator_accum.distribution import replicas

__all__ = ["SessionCluster"]


@dataclasses.dataclass(frozen=True)
class SessionCluster:
  """Where a training session runs: this process (one worker), or, under
  a MultiWorkerMirroredStrategy, this task's server in the strategy's
  cluster."""
  master: str = ""
  session_config: typing.Any = None
  workers: int = 1
  worker_index: int = 0
  is_chief: bool = True
  task: str = ""
  # A parameter-server job: the variables' device function, and whether
  # the chief alone saves (the others train on the ps's variables).
  device_fn: typing.Any = None
  shared_variables: bool = False

  def input_context(self, strategy):
    """The tf.distribute.InputContext this worker's input_fn is given, as
    Estimator gives it: one input pipeline a worker."""
    return tf.distribute.InputContext(
        num_input_pipelines=self.workers,
        input_pipeline_id=self.worker_index,
        num_replicas_in_sync=strategy.num_replicas_in_sync)

  def save_directory(self, model_dir):
    """Where this worker saves checkpoints and summaries: model_dir (the
    chief, one worker), else model_dir/tmp_<task>; None for a
    parameter-server job's workers (the chief saves the ps's variables)."""
    if self.is_chief:
      return model_dir
    if self.shared_variables:
      return None
    return os.path.join(model_dir, f"tmp_{self.task}")

  def saver_hooks(self, model_dir, scaffold, save_steps, save_at_start=True,
                  save_secs=None, listeners=()):
    """The hook that saves this worker's checkpoints every `save_steps`
    (a list: none for a parameter-server job's workers, where the chief
    saves the ps's variables and the others wait for it to start them).
    Under MultiWorkerMirroredStrategy every worker saves at the same steps,
    placed last among its hooks so that each runs them in the same order (a
    value summed over the workers is read by a collective each must join
    in turn): the chief in model_dir, the others in a directory of their
    own, removed with the job (as Estimator's workers do). Without
    `save_at_start`, none at the session's start at global step 0
    (`LeanCheckpointSaverHook`). `save_secs` (with `save_steps` None): every
    so many seconds, where one task saves alone (the run's
    settings refuse it under MultiWorkerMirroredStrategy); `listeners`:
    CheckpointSaverListeners of the saves."""
    saves = self.save_directory(model_dir)
    if saves is None:
      return []
    hook = (tf.compat.v1.train.CheckpointSaverHook if save_at_start else
            saver_hook.LeanCheckpointSaverHook)
    if save_steps is None and save_secs is None:
      return []
    return [hook(
        saves, save_steps=save_steps, save_secs=save_secs, scaffold=scaffold,
        save_graph_def=False, listeners=list(listeners))]

  @classmethod
  def parameter_servers(cls, tf_config, session_config=None):
    """The SessionCluster of a chief or worker of a parameter-server job
    (`tf_config`: TF_CONFIG as a dict), its server started; a ps task
    serves the variables here until the process ends, never returning.
    As Estimator's: the variables on the ps tasks
    (replica_device_setter), the session on the task's own server, seeing
    the ps tasks and itself only."""
    spec = tf.train.ClusterSpec(tf_config["cluster"])
    kind = tf_config["task"]["type"]
    index = int(tf_config["task"].get("index", 0))
    config = tf.compat.v1.ConfigProto()
    if session_config is not None:
      config.CopyFrom(session_config)
    config.allow_soft_placement = True
    del config.device_filters[:]
    # A ps serves its variables to the others' sessions (its worker
    # service); a session of its own (a stop request) sees ps tasks only.
    # Estimator's own ps filters admit every job: a session opened on the
    # ps's port reached the chief and every worker through it.
    config.device_filters.extend(
        ["/job:ps"] if kind == "ps" else
        ["/job:ps", f"/job:{kind}/task:{index}"] if kind == "worker" else
        ["/job:ps", f"/job:{kind}"])
    server = tf.distribute.Server(spec, job_name=kind, task_index=index,
                                  config=config, start=True)
    if kind == "ps":
      server.join()
    trainers, position = tfc.trainer_position(tf_config["cluster"], kind,
                                              index)
    return cls(
        master=server.target, session_config=config, workers=trainers,
        worker_index=position,
        is_chief=kind == "chief", task=f"{kind}_{index}",
        device_fn=tf.compat.v1.train.replica_device_setter(
            ps_tasks=spec.num_tasks("ps"),
            worker_device=f"/job:{kind}/task:{index}", merge_devices=True,
            cluster=spec),
        shared_variables=True)

  @classmethod
  def of(cls, strategy, session_config, parameter_servers=None):
    """The SessionCluster of `strategy` (None: one device), or, given
    `parameter_servers` (TF_CONFIG of a parameter-server job), of that
    job (`parameter_servers`, above)."""
    if parameter_servers:
      return cls.parameter_servers(parameter_servers, session_config)
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver else {}
    if not replicas.is_multi_worker_collective(strategy) or not cluster:
      return cls(session_config=session_config)
    if not isinstance(
        strategy,
        tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy):
      raise TypeError(
          "train_distribute: a cluster's graph sessions need "
          "tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy"
          f" (its collective ops serve sessions), got "
          f"{type(strategy).__name__}.")
    trainers, position = tfc.trainer_position(
        cluster, resolver.task_type, resolver.task_id)
    master = resolver.master()
    return cls(
        master=master if "://" in master else "grpc://" + master,
        session_config=strategy.update_config_proto(
            session_config or tf.compat.v1.ConfigProto()),
        workers=trainers, worker_index=position,
        is_chief=strategy.extended.should_checkpoint,
        task=f"{resolver.task_type}_{resolver.task_id}")
