"""Where a training session of the library's SessionEstimator runs: in
this process, or, under tf.compat.v1's MultiWorkerMirroredStrategy, on this
task's server in the strategy's cluster (the session's target and config,
this worker's place among the input pipelines, whether it is the chief,
where it saves)."""

import dataclasses
import os
import typing

import tensorflow as tf

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

  def input_context(self, strategy):
    """The tf.distribute.InputContext this worker's input_fn is given, as
    Estimator gives it: one input pipeline a worker."""
    return tf.distribute.InputContext(
        num_input_pipelines=self.workers,
        input_pipeline_id=self.worker_index,
        num_replicas_in_sync=strategy.num_replicas_in_sync)

  def save_directory(self, model_dir):
    """Where this worker saves checkpoints and summaries: model_dir (the
    chief, one worker), else model_dir/tmp_<task>."""
    if self.is_chief:
      return model_dir
    return os.path.join(model_dir, f"tmp_{self.task}")

  @classmethod
  def of(cls, strategy, session_config):
    """The SessionCluster of `strategy` (None: one device)."""
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
    chiefs = len(cluster.get("chief", []))
    index = resolver.task_id + (chiefs if resolver.task_type == "worker"
                                else 0)
    master = resolver.master()
    return cls(
        master=master if "://" in master else "grpc://" + master,
        session_config=strategy.update_config_proto(
            session_config or tf.compat.v1.ConfigProto()),
        workers=chiefs + len(cluster.get("worker", [])), worker_index=index,
        is_chief=strategy.extended.should_checkpoint,
        task=f"{resolver.task_type}_{resolver.task_id}")
