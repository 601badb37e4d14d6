"""`Estimator`: one way to run an Estimator model_fn on every TensorFlow
from 2.15 to 2.21.

It takes what `tf.estimator.Estimator` takes (`model_fn`, `model_dir`,
`config`, `params`, `warm_start_from`) and offers its `train`, `evaluate`,
`predict`, `export_saved_model`, `latest_checkpoint`,
`get_variable_value` and `get_variable_names`, through tf.compat.v1
sessions (runner.py): on one device, under MirroredStrategy, under
tf.compat.v1's MultiWorkerMirroredStrategy on the workers of a TF_CONFIG
cluster, and between graphs with parameter servers from TF_CONFIG. The
config is `estimator_accum.RunConfig` (on 2.15 that is
`tf.estimator.RunConfig`, which it takes too), and the model_fn returns
`estimator_accum.EstimatorSpec` (on 2.15 `tf.estimator.EstimatorSpec`).

    estimator = estimator_accum.Estimator(model_fn, model_dir="runs/x")
    estimator.train(input_fn, max_steps=1000)
"""

import os
import tempfile

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.estimator import run_config, runner, specs

__all__ = ["Estimator"]


class Estimator:
  """An Estimator model_fn trained, evaluated, used to predict and
  exported, on every release."""

  def __init__(self, model_fn, model_dir=None, config=None, params=None,
               warm_start_from=None):
    if not callable(model_fn):
      raise TypeError(f"Estimator: model_fn is a function (features, "
                      f"labels, mode, params, config), got "
                      f"{type(model_fn).__name__}.")
    if params is not None and not isinstance(params, dict):
      raise TypeError(f"Estimator: params is a dict, got "
                      f"{type(params).__name__}.")
    config = config if config is not None else (
        specs.of_this_release("RunConfig")())
    model_dir = _model_dir(model_dir, config)
    if getattr(config, "model_dir", None) != model_dir:
      config = config.replace(model_dir=model_dir)
    self._config = config
    self._runner = runner.SessionEstimator(
        model_fn, run_config.settings_of(config, model_dir,
                                         runner.RunSettings),
        params=params)
    self._warm_start = _warm_start(warm_start_from)

  @property
  def model_dir(self):
    return self._runner.model_dir

  @property
  def config(self):
    return self._config

  @property
  def params(self):
    return dict(self._runner.params)

  @property
  def model_fn(self):
    return self._runner.model_fn

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    """Trains until the global step is `max_steps`, or for `steps` more,
    or (neither) until the input ends; returns self."""
    if steps is not None and max_steps is not None:
      raise ValueError(f"Estimator.train: steps={steps!r} and "
                       f"max_steps={max_steps!r} both given; give one.")
    for name, value in (("steps", steps), ("max_steps", max_steps)):
      if value is not None:
        _checks.check_positive_int(f"Estimator.train: {name}", value,
                                   limit=2**62)
    specs.check_input_fn("Estimator.train", input_fn)
    reason = run_config.untrainable(self._config)
    if reason:
      raise ValueError(f"Estimator.train: {reason}")
    self._runner.train(input_fn, max_steps=max_steps, hooks=hooks or (),
                       steps=steps, saving_listeners=saving_listeners or (),
                       warm_start=self._warm_start)
    return self

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    """The metrics (with "loss" and "global_step") over `input_fn`'s data,
    or its first `steps` batches, at the latest checkpoint."""
    specs.check_input_fn("Estimator.evaluate", input_fn)
    if steps is not None:
      _checks.check_positive_int("Estimator.evaluate: steps", steps,
                                 limit=2**62)
    return self._runner.evaluate(input_fn, steps=steps, hooks=hooks or (),
                                 checkpoint_path=checkpoint_path, name=name)

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    """Yields the predictions over `input_fn`'s data at the latest
    checkpoint, one example at a time (or one batch)."""
    specs.check_input_fn("Estimator.predict", input_fn)
    return self._runner.predict(
        input_fn, predict_keys=predict_keys, hooks=hooks or (),
        checkpoint_path=checkpoint_path,
        yield_single_examples=yield_single_examples)

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         assets_extra=None, as_text=False,
                         checkpoint_path=None):
    """The PREDICT graph at the latest checkpoint (or `checkpoint_path`)
    as a SavedModel in a new directory under `export_dir_base` (returned,
    as bytes, as Estimator returns it)."""
    if assets_extra or as_text:
      raise ValueError("Estimator.export_saved_model: assets_extra and "
                       "as_text are not written by estimator_accum's "
                       "Estimator; leave them unset.")
    path = self._runner.export_saved_model(
        export_dir_base, serving_input_receiver_fn,
        checkpoint_path=checkpoint_path)
    return path if isinstance(path, bytes) else str(path).encode()

  def latest_checkpoint(self):
    return self._runner.latest_checkpoint()

  def get_variable_names(self):
    checkpoint = self._require_checkpoint()
    return [name for name, _ in tf.train.list_variables(checkpoint)]

  def get_variable_value(self, name):
    return tf.train.load_checkpoint(self._require_checkpoint()).get_tensor(
        name)

  def _require_checkpoint(self):
    checkpoint = self.latest_checkpoint()
    if checkpoint is None:
      raise ValueError(f"{self.model_dir} holds no checkpoint yet: train "
                       f"first.")
    return checkpoint


def _model_dir(model_dir, config):
  """The run's directory: `model_dir`, the config's, or (neither) a new
  temporary one, as Estimator chooses it."""
  configured = getattr(config, "model_dir", None)
  if model_dir is not None and configured is not None and (
      os.fspath(model_dir) != configured):
    raise ValueError(
        f"Estimator: model_dir={os.fspath(model_dir)!r} and "
        f"config.model_dir={configured!r} differ; give one.")
  chosen = model_dir if model_dir is not None else configured
  if chosen is None:
    chosen = tempfile.mkdtemp(prefix="estimator_accum_")
    print(f"[estimator_accum] no model_dir given: using {chosen}",
          flush=True)
  return os.fspath(chosen)


def _warm_start(warm_start_from):
  """What runs in a new run's training graph for `warm_start_from` (a
  checkpoint or its directory, or tf.estimator.WarmStartSettings-like
  settings): the trainable variables (or those matched) start at its
  values."""
  if warm_start_from is None:
    return None
  if isinstance(warm_start_from, (str, os.PathLike)):
    source, variables = os.fspath(warm_start_from), ".*"
  elif hasattr(warm_start_from, "ckpt_to_initialize_from"):
    source = warm_start_from.ckpt_to_initialize_from
    variables = warm_start_from.vars_to_warm_start
  else:
    raise TypeError(f"Estimator: warm_start_from is a checkpoint path or "
                    f"WarmStartSettings, got "
                    f"{type(warm_start_from).__name__}.")
  renames = {name: getattr(warm_start_from, name, None) for name in
             ("var_name_to_vocab_info", "var_name_to_prev_var_name")}
  return lambda: tf.compat.v1.train.warm_start(
      source, vars_to_warm_start=variables, **renames)
