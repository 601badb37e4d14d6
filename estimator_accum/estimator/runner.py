"""An Estimator model_fn trained, evaluated and used to predict without
tf.estimator, which TensorFlow 2.16+ does not have.

The model_fn is called as Estimator calls it (`features`, `labels`, `mode`,
`params`, `config`, as many as it names) and returns `model_spec(...)`
(Estimator's EstimatorSpec where it exists, a `ModelSpec` of the same
fields where not). Training runs its train op in a
`tf.compat.v1.train.MonitoredTrainingSession` on `model_dir`: it restores
the latest checkpoint, saves every `save_checkpoints_steps` and at the end
(no `.meta` graph beside each: the events file holds the graph), writes
summaries, runs the spec's hooks, and stops at `max_steps` (global steps,
as Estimator's); `export_saved_model` writes the PREDICT graph for serving
(export.py). Training runs in each replica of a strategy
(`RunSettings.train_distribute`) as Estimator's does: MirroredStrategy in
one process, or tf.compat.v1's MultiWorkerMirroredStrategy on each worker
of a TF_CONFIG cluster (each worker's session on its own task's server, the
input_fn given each worker's `input_context`, every worker saving at the
same steps, the chief in `model_dir`); with `RunSettings.parameter_servers` (TF_CONFIG
of a parameter-server job) between graphs as Estimator trains one: each
chief and worker on its own server, the variables on the ps tasks, a ps
task serving them; evaluation and prediction on one device, as Estimator's
without an `eval_distribute`.

    runner = SessionEstimator(model_fn, RunSettings(model_dir="runs/x"))
    runner.train(input_fn, max_steps=1000)

(The public name is `estimator_accum.Estimator`, estimator.py, which takes
Estimator's arguments and RunConfig and runs on this.)
    metrics = runner.evaluate(eval_input_fn)
    for prediction in runner.predict(test_input_fn): ...
"""

import contextlib
import dataclasses
import inspect
import os
import typing

import tensorflow as tf

from estimator_accum.distribution import replicas, session_cluster
from estimator_accum.estimator import export as session_export
from estimator_accum.estimator import specs

__all__ = ["EVAL", "PREDICT", "TRAIN", "ModelSpec", "RunSettings",
           "SessionEstimator", "call_as_estimator", "global_step_at",
           "input_features", "model_spec"]

# Estimator's ModeKeys, the same strings (on every release).
TRAIN, EVAL, PREDICT = "train", "eval", "infer"


# Estimator's EstimatorSpec fields, where TensorFlow has no Estimator.
ModelSpec = specs.EstimatorSpec


def model_spec(mode, **fields):
  """`tf.estimator.EstimatorSpec(mode, **fields)` where this TensorFlow has
  Estimator, else the library's EstimatorSpec of the same fields."""
  return specs.of_this_release("EstimatorSpec")(mode, **fields)


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """What Estimator's RunConfig says of a one-device run."""
  model_dir: str
  tf_random_seed: typing.Optional[int] = None
  session_config: typing.Any = None
  save_checkpoints_steps: typing.Optional[int] = 1000
  keep_checkpoint_max: int = 5
  save_summary_steps: typing.Optional[int] = 100
  # Estimator's others: with save_checkpoints_steps None, a save every so
  # many seconds; the Saver's hours; the steps/sec lines' interval.
  save_checkpoints_secs: typing.Optional[int] = None
  keep_checkpoint_every_n_hours: float = 10000
  log_step_count_steps: typing.Optional[int] = None
  # A tf.distribute strategy whose replicas each train a copy of the
  # model_fn, as Estimator's `train_distribute`: MirroredStrategy, or
  # tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy.
  train_distribute: typing.Any = None
  # TF_CONFIG (a dict) of a parameter-server job, trained between graphs
  # as Estimator trains one without train_distribute: each chief and
  # worker its own graph on its own server, the variables on the ps tasks.
  parameter_servers: typing.Any = None
  # False: no checkpoint at the session's start while the global step is 0
  # (`LeanCheckpointSaverHook`: it would hold the initial values, which a
  # new run rebuilds alike). True: TensorFlow's saver, which saves there.
  save_at_start: bool = True


def call_as_estimator(function, **arguments):
  """Calls `function` (a model_fn or an input_fn) with those of
  `arguments` it names, as Estimator does."""
  names = inspect.signature(function).parameters
  return function(**{name: value for name, value in arguments.items()
                     if name in names})


def input_features(input_fn, params, config, repeat=False):
  """(features, labels) of `input_fn` called as Estimator calls it: a
  Dataset's next element (of the Dataset repeated, with `repeat`), a
  (features, labels) pair, or features alone (labels None)."""
  result = call_as_estimator(input_fn, params=params, config=config)
  if isinstance(result, tf.data.Dataset):
    result = tf.compat.v1.data.make_one_shot_iterator(
        result.repeat() if repeat else result).get_next()
  return _features_and_labels(result)


def _features_and_labels(element):
  """(features, labels) of an input_fn's element: a (features, labels)
  pair, or features alone (labels None)."""
  if isinstance(element, (tuple, list)) and len(element) == 2:
    return element[0], element[1]
  return element, None


class SessionEstimator:
  """Estimator's train, evaluate and predict for a model_fn (training in a
  one-process strategy's replicas if the settings give one),
  through tf.compat.v1 sessions."""

  def __init__(self, model_fn, config, params=None):
    self._model_fn = model_fn
    self.config = config
    self.params = dict(params or {})

  @property
  def model_dir(self):
    return self.config.model_dir

  @property
  def model_fn(self):
    return self._model_fn

  def latest_checkpoint(self):
    return tf.train.latest_checkpoint(self.model_dir)

  def get_variable_value(self, name):
    return tf.train.load_checkpoint(self.model_dir).get_tensor(name)

  def _start_graph(self):
    """The default graph's seed and global step (returned), as Estimator
    sets them before it calls the model_fn."""
    tf.compat.v1.set_random_seed(self.config.tf_random_seed)
    return tf.compat.v1.train.get_or_create_global_step()

  def _model(self, features, labels, mode):
    """The model_fn's spec in `mode`, called as Estimator calls it."""
    return call_as_estimator(
        self._model_fn, features=features, labels=labels, mode=mode,
        params=self.params, config=self.config)

  def _spec(self, input_fn, mode):
    """(global step, spec) of the model_fn in `mode` in the default graph,
    its features from `input_fn`."""
    global_step = self._start_graph()
    features, labels = input_features(input_fn, self.params, self.config)
    return global_step, self._model(features, labels, mode)

  def train(self, input_fn, max_steps=None, hooks=(), steps=None,
            saving_listeners=(), warm_start=None):
    """Trains until the global step is `max_steps` (nothing when the latest
    checkpoint is there already), or `steps` more than the latest
    checkpoint's, or (neither) until the input ends; returns self.
    `warm_start`: a callable run in the training graph when model_dir holds
    no checkpoint yet (Estimator's `warm_start_from`)."""
    latest = self.latest_checkpoint()
    if steps is not None:
      max_steps = global_step_at(latest) + steps
    elif max_steps is not None and global_step_at(latest) >= max_steps:
      return self
    strategy = self.config.train_distribute
    cluster = session_cluster.SessionCluster.of(
        strategy, self.config.session_config, self.config.parameter_servers)
    with tf.Graph().as_default(), (
        strategy.scope() if strategy else contextlib.nullcontext()), (
            tf.compat.v1.device(cluster.device_fn) if cluster.device_fn
            else contextlib.nullcontext()):
      train_op, spec = (
          self._replicated_train_op(input_fn, strategy, cluster)
          if strategy else self._train_op(input_fn))
      if warm_start is not None and latest is None:
        warm_start()
      with _training_session(self.config, cluster, spec, max_steps,
                             [*spec.training_hooks, *hooks],
                             saving_listeners) as session:
        while not session.should_stop():
          session.run(train_op)
    return self

  def _train_op(self, input_fn):
    """(train op, spec) of the model_fn in TRAIN mode."""
    _, spec = self._spec(input_fn, TRAIN)
    return spec.train_op, spec

  def _replicated_train_op(self, input_fn, strategy, cluster):
    """(train op, the first replica's spec) of the model_fn in TRAIN mode
    in each of `strategy`'s replicas, in its scope, as Estimator's
    `train_distribute` builds it: the input_fn (given this worker's
    `input_context`) returns a Dataset of one replica's batches, and each
    replica of the worker takes the next batch of it."""
    self._start_graph()
    dataset = call_as_estimator(
        input_fn, params=self.params, config=self.config,
        input_context=cluster.input_context(strategy))
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(
          f"under {type(strategy).__name__} the input_fn returns a "
          f"tf.data.Dataset of each replica's batches, as Estimator's "
          f"train_distribute takes; got {type(dataset).__name__}.")
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    specs = {}

    def replica_step():
      spec = self._model(*_features_and_labels(iterator.get_next()), TRAIN)
      specs[replicas.replica_id()] = spec
      return spec.train_op

    train_op = strategy.group(
        strategy.extended.call_for_each_replica(replica_step))
    # (Replica ids count over the cluster: this worker's first.)
    return train_op, specs[min(specs)]

  def evaluate(self, input_fn, steps=None, hooks=(), checkpoint_path=None,
               name=None):
    """The spec's metrics (and "loss", the mean of its loss, and
    "global_step") over `input_fn`'s data, or its first `steps` batches, at
    the latest checkpoint (or `checkpoint_path`); written for TensorBoard
    in model_dir/eval (eval_<name>) as Estimator writes them."""
    with tf.Graph().as_default():
      global_step, spec = self._spec(input_fn, EVAL)
      metrics = dict(spec.eval_metric_ops or {})
      metrics.setdefault("loss", tf.compat.v1.metrics.mean(spec.loss))
      updates = [update for _, update in metrics.values()]
      final = tf.compat.v1.train.FinalOpsHook(
          {**{name: value for name, (value, _) in metrics.items()},
           "global_step": global_step})
      done = 0
      with _restoring(self, [*spec.evaluation_hooks, *hooks, final],
                           checkpoint_path) as session:
        while not session.should_stop() and (steps is None or done < steps):
          session.run(updates)
          done += 1
    results = dict(final.final_ops_values)
    _write_metrics(os.path.join(
        self.model_dir, f"eval_{name}" if name else "eval"), results)
    return results

  def predict(self, input_fn, predict_keys=None, hooks=(),
              checkpoint_path=None, yield_single_examples=True):
    """Yields the spec's predictions over `input_fn`'s data at the latest
    checkpoint (or `checkpoint_path`): one example at a time (a dict of
    arrays, or an array where the model_fn predicts one tensor), or whole
    batches with `yield_single_examples=False`; `predict_keys` keeps those
    keys of a dict."""
    with tf.Graph().as_default():
      _, spec = self._spec(input_fn, PREDICT)
      predictions = _kept(spec.predictions, predict_keys)
      with _restoring(self, [*spec.prediction_hooks, *hooks],
                           checkpoint_path) as session:
        # (The input's end raises OutOfRangeError, which the session's
        # exit takes as the end.)
        while not session.should_stop():
          batch = session.run(predictions)
          if not yield_single_examples:
            yield batch
          elif not isinstance(batch, dict):
            yield from batch
          else:
            size = len(next(iter(batch.values())))
            for row in range(size):
              yield {key: value[row] for key, value in batch.items()}

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         checkpoint_path=None):
    """Writes the PREDICT graph with the latest checkpoint's (or
    `checkpoint_path`'s) variables as a SavedModel under `export_dir_base`,
    as Estimator's `export_saved_model` does; returns its directory."""
    checkpoint = checkpoint_path or self.latest_checkpoint()
    if checkpoint is None:
      raise ValueError(f"{self.model_dir} holds no checkpoint to export.")

    def build_predict(features):
      # (session_export makes the global step, before the receiver.)
      tf.compat.v1.set_random_seed(self.config.tf_random_seed)
      return self._model(features, None, PREDICT)

    return session_export.export_saved_model(
        build_predict, export_dir_base, serving_input_receiver_fn,
        checkpoint)


def _training_session(config, cluster, spec, max_steps, hooks,
                      saving_listeners):
  """The MonitoredTrainingSession a run trains in on `cluster` (a
  SessionCluster): `hooks` and the spec's chief-only hooks, a stop at
  `max_steps` (None: none), the settings' saves (each worker restores the
  latest checkpoint or initializes, the strategy broadcasting the first
  worker's values; where it saves: SessionCluster.saver_hooks) and
  summaries."""
  scaffold = _scaffold(spec, config)
  saves = cluster.save_directory(config.model_dir)
  stop = ([tf.compat.v1.train.StopAtStepHook(last_step=max_steps)]
          if max_steps is not None else [])
  return tf.compat.v1.train.MonitoredTrainingSession(
      master=cluster.master,
      is_chief=cluster.is_chief or not cluster.shared_variables,
      checkpoint_dir=config.model_dir, summary_dir=saves, scaffold=scaffold,
      hooks=[*stop, *hooks,
             *cluster.saver_hooks(config.model_dir, scaffold,
                                  config.save_checkpoints_steps,
                                  config.save_at_start,
                                  config.save_checkpoints_secs,
                                  saving_listeners)],
      chief_only_hooks=list(getattr(spec, "training_chief_hooks", ())),
      save_checkpoint_steps=None, save_checkpoint_secs=None,
      save_summaries_steps=(config.save_summary_steps
                            if saves is not None else None),
      log_step_count_steps=(config.log_step_count_steps
                            if saves is not None else None),
      save_graph_def=False, config=cluster.session_config)


def _kept(predictions, keys):
  """`predictions` (a dict) reduced to `keys`; a tensor as it is."""
  if keys is None:
    return predictions
  keys = [keys] if isinstance(keys, str) else list(keys)
  if not isinstance(predictions, dict):
    raise ValueError(f"predict_keys={keys!r}: the model_fn predicts one "
                     f"tensor, not a dict; leave predict_keys None.")
  missing = [key for key in keys if key not in predictions]
  if missing:
    raise ValueError(f"predict_keys: {missing} not among the predictions' "
                     f"keys {sorted(predictions)}.")
  return {key: predictions[key] for key in keys}


def _write_metrics(directory, results):
  """The evaluation's scalar results as summaries at its global step."""
  values = [tf.compat.v1.Summary.Value(tag=name, simple_value=float(value))
            for name, value in sorted(results.items())
            if name != "global_step" and getattr(value, "size", 1) == 1]
  with tf.Graph().as_default():
    writer = tf.compat.v1.summary.FileWriterCache.get(directory)
    writer.add_summary(tf.compat.v1.Summary(value=values),
                       int(results.get("global_step", 0)))
    writer.flush()


def _scaffold(spec, config):
  """The spec's Scaffold (or a new one) with the run's Saver, sharded
  and keeping `keep_checkpoint_max`, where the model_fn gave none."""
  scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
  if scaffold.saver is None and not tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.SAVERS):
    tf.compat.v1.add_to_collection(
        tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver(
            sharded=True, max_to_keep=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=(
                config.keep_checkpoint_every_n_hours),
            save_relative_paths=True))
  return scaffold


def global_step_at(checkpoint):
  """The global step `checkpoint` holds (0 for None: none yet)."""
  if checkpoint is None:
    return 0
  return int(tf.train.load_checkpoint(checkpoint).get_tensor(
      tf.compat.v1.GraphKeys.GLOBAL_STEP))


def _restoring(runner, hooks=(), checkpoint_path=None):
  """A MonitoredSession on the latest checkpoint (or `checkpoint_path`),
  `hooks` run in it."""
  checkpoint = checkpoint_path or runner.latest_checkpoint()
  if checkpoint is None:
    raise ValueError(f"{runner.model_dir} holds no checkpoint to restore.")
  return tf.compat.v1.train.MonitoredSession(
      session_creator=tf.compat.v1.train.ChiefSessionCreator(
          checkpoint_filename_with_path=checkpoint,
          config=runner.config.session_config),
      hooks=list(hooks))
