"""`RunConfig` where TensorFlow has no Estimator (2.16+), and what the
library's Estimator reads of any RunConfig (`settings_of`).

The RunConfig here takes `tf.estimator.RunConfig`'s arguments with their
defaults and reads TF_CONFIG as it does (`cluster_spec`, `task_type`,
`task_id`, `is_chief`, `num_worker_replicas`, `num_ps_replicas`), so that a
model_fn that reads its `config` runs unchanged. On 2.15
`estimator_accum.RunConfig` is `tf.estimator.RunConfig` itself; the
Estimator takes either.
"""

import dataclasses

import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum import _checks
from estimator_accum.distribution import replicas

__all__ = ["RunConfig", "settings_of", "untrainable"]

_DEFAULT = object()
# Estimator's checkpoint interval when neither is given.
DEFAULT_CHECKPOINT_SECS = 600
# Arguments of tf.estimator.RunConfig the library's Estimator does not run,
# with why: given anything but None, they are refused in one line.
_NOT_RUN = {
    "device_fn": "the variables' placement follows the strategy or the ps",
    "protocol": "the servers speak gRPC",
    "eval_distribute": "evaluation runs on one device",
    "experimental_distribute": "give train_distribute",
    "experimental_max_worker_delay_secs": "the workers start together",
}


class RunConfig:
  """tf.estimator.RunConfig's settings, for TensorFlow 2.16+."""

  def __init__(self, model_dir=None, tf_random_seed=None,
               save_summary_steps=100, save_checkpoints_steps=_DEFAULT,
               save_checkpoints_secs=_DEFAULT, session_config=None,
               keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000,
               log_step_count_steps=100, train_distribute=None,
               device_fn=None, protocol=None, eval_distribute=None,
               experimental_distribute=None,
               experimental_max_worker_delay_secs=None,
               session_creation_timeout_secs=7200,
               checkpoint_save_graph_def=True):
    _refuse_not_run(locals())
    steps_given = save_checkpoints_steps is not _DEFAULT
    secs_given = save_checkpoints_secs is not _DEFAULT
    steps = save_checkpoints_steps if steps_given else None
    secs = save_checkpoints_secs if secs_given else None
    if steps is not None and secs is not None:
      raise ValueError(
          f"RunConfig: save_checkpoints_steps={steps!r} and "
          f"save_checkpoints_secs={secs!r} both given; give one.")
    if not steps_given and not secs_given:
      secs = DEFAULT_CHECKPOINT_SECS
    for name, value in (("save_checkpoints_steps", steps),
                        ("save_checkpoints_secs", secs),
                        ("save_summary_steps", save_summary_steps),
                        ("log_step_count_steps", log_step_count_steps)):
      if value is not None:
        _checks.check_positive_int(f"RunConfig: {name}", value, limit=2**62)
    if tf_random_seed is not None and (isinstance(tf_random_seed, bool) or
                                       not isinstance(tf_random_seed, int)):
      raise TypeError(f"RunConfig: tf_random_seed is an int or None, got "
                      f"{_checks.short(tf_random_seed)}.")
    _checks.check_positive_int("RunConfig: keep_checkpoint_max",
                               keep_checkpoint_max or 1, limit=2**31)
    if session_config is not None and not isinstance(
        session_config, tf.compat.v1.ConfigProto):
      raise TypeError(f"RunConfig: session_config is a "
                      f"tf.compat.v1.ConfigProto, got "
                      f"{type(session_config).__name__}.")
    self._settings = dict(
        model_dir=None if model_dir is None else str(model_dir),
        tf_random_seed=tf_random_seed, save_summary_steps=save_summary_steps,
        save_checkpoints_steps=steps, save_checkpoints_secs=secs,
        session_config=session_config,
        keep_checkpoint_max=keep_checkpoint_max,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        log_step_count_steps=log_step_count_steps,
        train_distribute=train_distribute,
        session_creation_timeout_secs=session_creation_timeout_secs,
        checkpoint_save_graph_def=checkpoint_save_graph_def)
    task = _environment_task()
    self._cluster, self._task_type, self._task_id = (
        task.cluster, task.task_type, task.task_id)

  def replace(self, **changes):
    """A RunConfig with `changes` made, as Estimator's `replace`."""
    unknown = sorted(set(changes) - set(self._settings))
    if unknown:
      raise ValueError(f"RunConfig.replace: no setting {unknown[0]!r}.")
    settings = {**self._settings, **changes}
    if "save_checkpoints_steps" in changes and "save_checkpoints_secs" not in (
        changes):
      settings["save_checkpoints_secs"] = None
    if "save_checkpoints_secs" in changes and "save_checkpoints_steps" not in (
        changes):
      settings["save_checkpoints_steps"] = None
    return RunConfig(**settings)

  def __getattr__(self, name):
    settings = self.__dict__.get("_settings", {})
    if name in settings:
      return settings[name]
    raise AttributeError(f"RunConfig has no {name!r}")

  @property
  def cluster_spec(self):
    return tf.train.ClusterSpec(_training(self._cluster))

  @property
  def task_type(self):
    return self._task_type

  @property
  def task_id(self):
    return self._task_id

  @property
  def num_ps_replicas(self):
    return len(self._cluster.get(tfc.PS, []))

  @property
  def num_worker_replicas(self):
    trainers, _ = tfc.trainer_position(self._cluster, self._task_type, 0)
    return max(trainers, 1)

  @property
  def is_chief(self):
    if not self._cluster or self._task_type == tfc.CHIEF:
      return True
    return (self._task_type == tfc.WORKER and self._task_id == 0 and
            tfc.CHIEF not in self._cluster)

  @property
  def master(self):
    addresses = self._cluster.get(self._task_type, [])
    if self._task_id < len(addresses) and self._task_type != tfc.EVALUATOR:
      return "grpc://" + addresses[self._task_id]
    return ""

  @property
  def evaluation_master(self):
    return ""

  @property
  def global_id_in_cluster(self):
    _, position = tfc.trainer_position(self._cluster, self._task_type,
                                       self._task_id)
    return position

  def __repr__(self):
    shown = ", ".join(f"{name}={value!r}" for name, value
                      in self._settings.items() if value is not None)
    return f"RunConfig({shown})"


def _refuse_not_run(values):
  """Refuses, in one line, the first of `values` (name: value) that is one
  of the arguments the library's Estimator does not run, given."""
  for name, value in values.items():
    if name in _NOT_RUN and value is not None:
      raise ValueError(
          f"RunConfig: {name}={_checks.short(value)} is not run by "
          f"estimator_accum.Estimator ({_NOT_RUN[name]}); leave it None.")


def _training(cluster):
  """`cluster` without the evaluator (TensorFlow keeps it out of the
  training cluster)."""
  return {kind: addresses for kind, addresses in cluster.items()
          if kind != tfc.EVALUATOR}


@dataclasses.dataclass(frozen=True)
class _Task:
  """Where a RunConfig's process stands in its cluster."""
  cluster: dict
  task_type: str
  task_id: int


def _environment_task():
  """This process's place as TF_CONFIG gives it, the evaluator kept: no
  cluster, a worker of index 0, where it names none."""
  read = tfc.from_environment()
  task = read.get(tfc.TASK) or {}
  return _Task({kind: list(addresses) for kind, addresses
                in read.get(tfc.CLUSTER, {}).items()},
               task.get(tfc.TYPE, tfc.WORKER), int(task.get(tfc.INDEX, 0)))


def task_of(config):
  """This process's place (cluster, type, index), as TF_CONFIG gives it
  (both RunConfigs read it; tf.estimator's keeps no cluster under a
  strategy), the evaluator kept; `config`'s where TF_CONFIG names none."""
  task = _environment_task()
  if task.cluster:
    return task
  return _Task({}, config.task_type or tfc.WORKER, int(config.task_id or 0))


def untrainable(config):
  """Why `config` cannot train here (a cluster of several training tasks,
  no ps and no train_distribute), else None. Asked when training starts:
  the same Estimator evaluates, predicts and exports in any task."""
  task = task_of(config)
  if (config.train_distribute is not None or task.cluster.get(tfc.PS) or
      task.task_type == tfc.EVALUATOR):
    return None
  trainers, _ = tfc.trainer_position(_training(task.cluster),
                                     task.task_type, 0)
  if trainers <= 1:
    return None
  return (f"TF_CONFIG names {trainers} training tasks and no ps, and "
          f"RunConfig(train_distribute=None): give train_distribute="
          f"tf.compat.v1.distribute.experimental."
          f"MultiWorkerMirroredStrategy() to train them as one, or ps "
          f"tasks to train between graphs.")


def settings_of(config, model_dir, runner_settings):
  """The runner's settings (`runner_settings`, its RunSettings type) of
  `config`, a tf.estimator RunConfig or the library's, on `model_dir`."""
  # (tf.estimator's RunConfig may say "grpc", the protocol there is.)
  values = {name: getattr(config, name, None) for name in _NOT_RUN}
  if values["protocol"] == "grpc":
    values["protocol"] = None
  _refuse_not_run(values)
  task = task_of(config)
  training = _training(task.cluster)
  strategy = config.train_distribute
  steps = config.save_checkpoints_steps
  secs = config.save_checkpoints_secs
  if steps is None and secs is not None and (
      replicas.is_multi_worker_collective(strategy) and
      len(task.cluster) > 0):
    raise ValueError(
        f"RunConfig: save_checkpoints_secs={secs!r} under "
        f"{type(strategy).__name__}: every worker saves at the same global "
        f"steps (a save reads values summed over the workers); give "
        f"save_checkpoints_steps instead.")
  parameter_servers = None
  if task.cluster.get(tfc.PS) and strategy is None:
    parameter_servers = {tfc.CLUSTER: training,
                         tfc.TASK: {tfc.TYPE: task.task_type,
                                    tfc.INDEX: task.task_id}}
  return runner_settings(
      model_dir=model_dir, tf_random_seed=config.tf_random_seed,
      session_config=config.session_config,
      save_checkpoints_steps=steps, save_checkpoints_secs=secs,
      keep_checkpoint_max=config.keep_checkpoint_max,
      keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
      save_summary_steps=config.save_summary_steps,
      log_step_count_steps=config.log_step_count_steps,
      train_distribute=strategy, parameter_servers=parameter_servers)
