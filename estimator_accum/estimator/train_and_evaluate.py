"""`train_and_evaluate`, as tf.estimator's, for the library's Estimator.

What a task does follows TF_CONFIG, as in tf.estimator:

- one process (no cluster): trains, evaluating at a checkpoint saved at
  least `throttle_secs` after the last evaluation (not the first save) and
  at the end, the exporters run after each evaluation;
- the chief and the workers of a cluster train (the ps tasks serve);
- the evaluator waits `start_delay_secs`, then evaluates each new
  checkpoint (at most one every `throttle_secs`) until the one at
  `TrainSpec.max_steps`.

Returns (the last evaluation's metrics, the exporters' results), or
(None, []) on a task that does not evaluate. Given a `tf.estimator`
Estimator (2.15), tf.estimator.train_and_evaluate runs it.
"""

import os
import time

import tensorflow as tf

from clusterspec import config as tfc
from estimator_accum import releases
from estimator_accum.estimator import run_config, runner, specs

__all__ = ["train_and_evaluate"]


def train_and_evaluate(estimator, train_spec, eval_spec):
  """Trains and evaluates `estimator` by `train_spec` and `eval_spec`
  (the library's TrainSpec and EvalSpec, or tf.estimator's)."""
  train_spec = _ours(train_spec, specs.TrainSpec, "train_spec")
  eval_spec = _ours(eval_spec, specs.EvalSpec, "eval_spec")
  tf_estimator = releases.estimator()
  if tf_estimator is not None and isinstance(estimator,
                                             tf_estimator.Estimator):
    return tf_estimator.train_and_evaluate(
        estimator, tf_estimator.TrainSpec(*train_spec),
        tf_estimator.EvalSpec(*eval_spec))
  task = run_config.task_of(estimator.config)
  if task.task_type == tfc.EVALUATOR:
    return _evaluator(estimator, train_spec, eval_spec)
  if not task.cluster:
    return _one_process(estimator, train_spec, eval_spec)
  # As tf.estimator's: in a cluster the evaluator task evaluates (the
  # training tasks' TF_CONFIG does not name it); the others train.
  estimator.train(train_spec.input_fn, hooks=list(train_spec.hooks),
                  max_steps=train_spec.max_steps)
  return None, []


def _ours(spec, kind, argument):
  """`spec` as the library's `kind` (tf.estimator's has the same fields
  in the same order)."""
  if isinstance(spec, kind):
    return spec
  if not isinstance(spec, tuple) or type(spec).__name__ != kind.__name__:
    raise TypeError(f"train_and_evaluate: {argument} is a "
                    f"{kind.__name__}, got {type(spec).__name__}.")
  return kind(*spec)


class _Evaluation:
  """Evaluations of one EvalSpec, each followed by its exporters."""

  def __init__(self, estimator, eval_spec, max_steps):
    self.estimator, self.spec, self.max_steps = estimator, eval_spec, max_steps
    self.result, self.exports, self.step = None, [], None

  def run(self, checkpoint, final=False):
    """Evaluates `checkpoint` and exports; the export is the final one at
    `max_steps` (as Estimator's), or when `final`."""
    spec = self.spec
    self.result = self.estimator.evaluate(
        spec.input_fn, steps=spec.steps, hooks=list(spec.hooks),
        checkpoint_path=checkpoint, name=spec.name)
    self.step = int(self.result["global_step"])
    final = final or (self.max_steps is not None and
                      self.step >= self.max_steps)
    self.exports = [
        exporter.export(self.estimator, os.path.join(
            self.estimator.model_dir, "export", exporter.name), checkpoint,
            self.result, final)
        for exporter in spec.exporters]


class _EvaluateAfterSaves(tf.compat.v1.train.CheckpointSaverListener):
  """Estimator's local evaluation: after a save (not the first) once
  `throttle_secs` have passed since the last, and at the end."""

  def __init__(self, evaluation):
    self.evaluation = evaluation
    self._last, self._first = None, True

  def after_save(self, session, global_step_value):
    del session
    if self._first:
      self._first = False
      return
    now = time.monotonic()
    if self._last is not None and (
        now - self._last < self.evaluation.spec.throttle_secs):
      return
    self._last = now
    self.evaluation.run(self.evaluation.estimator.latest_checkpoint())

  def end(self, session, global_step_value):
    del session
    if self.evaluation.step != global_step_value:
      self.evaluation.run(self.evaluation.estimator.latest_checkpoint(),
                          final=True)


def _one_process(estimator, train_spec, eval_spec):
  evaluation = _Evaluation(estimator, eval_spec, train_spec.max_steps)
  estimator.train(train_spec.input_fn, hooks=list(train_spec.hooks),
                  max_steps=train_spec.max_steps,
                  saving_listeners=[_EvaluateAfterSaves(evaluation)])
  if evaluation.result is None or (
      evaluation.step != runner.global_step_at(
          estimator.latest_checkpoint())):
    # No save ran the listener's end (checkpoints off, or nothing left to
    # train): the latest checkpoint is evaluated here.
    evaluation.run(estimator.latest_checkpoint(), final=True)
  return evaluation.result, evaluation.exports


def _evaluator(estimator, train_spec, eval_spec):
  """The evaluator task: each new checkpoint until the last one."""
  if train_spec.max_steps is None:
    raise ValueError(
        "train_and_evaluate on the evaluator task: TrainSpec.max_steps is "
        "None, so no checkpoint is known to be the last; give max_steps.")
  time.sleep(eval_spec.start_delay_secs)
  evaluation = _Evaluation(estimator, eval_spec, train_spec.max_steps)
  for checkpoint in tf.train.checkpoints_iterator(
      estimator.model_dir, min_interval_secs=eval_spec.throttle_secs):
    evaluation.run(checkpoint)
    print(f"[estimator_accum] evaluated {checkpoint}: " + ", ".join(
        f"{name} {value:.6g}" for name, value in sorted(
            evaluation.result.items()) if getattr(value, "size", 1) == 1),
          flush=True)
    if evaluation.step >= train_spec.max_steps:
      break
  return evaluation.result, evaluation.exports
