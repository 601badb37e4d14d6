"""The types a model_fn and `train_and_evaluate` are written with.

On TensorFlow 2.15 `EstimatorSpec` and `ModeKeys` are `tf.estimator`'s own
(`of_this_release`); on 2.16+, which has no Estimator, they are the ones
here: the same fields, defaults and mode strings, checked as Estimator
checks them. `TrainSpec` and `EvalSpec` are the library's on every release
(`train_and_evaluate` takes `tf.estimator`'s too).
"""

import typing

from estimator_accum import _checks, releases

__all__ = ["EstimatorSpec", "EvalSpec", "ModeKeys", "TrainSpec",
           "check_input_fn", "of_this_release"]


class ModeKeys:
  """The mode a model_fn is called in (Estimator's strings)."""
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


class _SpecFields(typing.NamedTuple):
  mode: str
  predictions: typing.Any = None
  loss: typing.Any = None
  train_op: typing.Any = None
  eval_metric_ops: typing.Any = None
  export_outputs: typing.Any = None
  training_chief_hooks: tuple = ()
  training_hooks: tuple = ()
  scaffold: typing.Any = None
  evaluation_hooks: tuple = ()
  prediction_hooks: tuple = ()


class EstimatorSpec(_SpecFields):
  """What a model_fn returns: Estimator's EstimatorSpec, its fields in its
  order. TRAIN needs `loss` and `train_op`, EVAL `loss`, PREDICT
  `predictions` (a tensor or a dict of them)."""

  __slots__ = ()

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metric_ops=None, export_outputs=None,
              training_chief_hooks=None, training_hooks=None, scaffold=None,
              evaluation_hooks=None, prediction_hooks=None):
    if mode not in MODES:
      raise ValueError(f"EstimatorSpec: mode={mode!r} is not one of "
                       f"ModeKeys.TRAIN, EVAL, PREDICT ({MODES}).")
    needed = {ModeKeys.TRAIN: ("loss", "train_op"), ModeKeys.EVAL: ("loss",),
              ModeKeys.PREDICT: ("predictions",)}[mode]
    given = {"loss": loss, "train_op": train_op, "predictions": predictions}
    missing = [name for name in needed if given[name] is None]
    if missing:
      raise ValueError(
          f"EstimatorSpec(mode={mode!r}) needs {' and '.join(missing)}; "
          f"got {', '.join(f'{name}=None' for name in missing)}.")
    if eval_metric_ops is not None and not isinstance(eval_metric_ops, dict):
      raise TypeError(
          f"EstimatorSpec: eval_metric_ops is a dict of name: (value, "
          f"update op), got {type(eval_metric_ops).__name__}.")
    return super().__new__(
        cls, mode, predictions, loss, train_op, eval_metric_ops,
        export_outputs, tuple(training_chief_hooks or ()),
        tuple(training_hooks or ()), scaffold, tuple(evaluation_hooks or ()),
        tuple(prediction_hooks or ()))


class _TrainFields(typing.NamedTuple):
  input_fn: typing.Callable
  max_steps: typing.Optional[int] = None
  hooks: tuple = ()


class TrainSpec(_TrainFields):
  """`train_and_evaluate`'s training: the input_fn, the global step to
  stop at (None: until the input ends), hooks."""

  __slots__ = ()

  def __new__(cls, input_fn, max_steps=None, hooks=()):
    check_input_fn("TrainSpec", input_fn)
    if max_steps is not None:
      max_steps = _checks.check_positive_int("TrainSpec: max_steps", max_steps,
                                           limit=2**62)
    return super().__new__(cls, input_fn, max_steps, tuple(hooks or ()))


class _EvalFields(typing.NamedTuple):
  input_fn: typing.Callable
  steps: typing.Optional[int] = 100
  name: typing.Optional[str] = None
  hooks: tuple = ()
  exporters: tuple = ()
  start_delay_secs: float = 120
  throttle_secs: float = 600


class EvalSpec(_EvalFields):
  """`train_and_evaluate`'s evaluation: the input_fn, its first `steps`
  batches (None: all of it), the evaluation's name, hooks, exporters, and
  (on one process) the seconds between two evaluations at least."""

  __slots__ = ()

  def __new__(cls, input_fn, steps=100, name=None, hooks=(), exporters=(),
              start_delay_secs=120, throttle_secs=600):
    check_input_fn("EvalSpec", input_fn)
    if steps is not None:
      steps = _checks.check_positive_int("EvalSpec: steps", steps, limit=2**62)
    for label, value in (("start_delay_secs", start_delay_secs),
                         ("throttle_secs", throttle_secs)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or (
          value < 0):
        raise ValueError(f"EvalSpec: {label} is seconds, >= 0; got "
                         f"{value!r}.")
    if exporters is None:
      exporters = ()
    elif not isinstance(exporters, (list, tuple)):
      exporters = (exporters,)
    return super().__new__(cls, input_fn, steps, name, tuple(hooks or ()),
                           tuple(exporters), start_delay_secs, throttle_secs)


def check_input_fn(owner, input_fn):
  """Refuses, naming `owner`, an input_fn that is not a function."""
  if not callable(input_fn):
    raise TypeError(f"{owner}: input_fn is a function returning a "
                    f"tf.data.Dataset or (features, labels); got "
                    f"{type(input_fn).__name__}.")


def of_this_release(name):
  """`tf.estimator.<name>` (`tf.estimator.export.<name>`) where TensorFlow
  has Estimator (2.15), else the library's (`EstimatorSpec`, `ModeKeys`;
  `RunConfig` from run_config; `ServingInputReceiver`, `PredictOutput`
  from export)."""
  estimator = releases.estimator()
  exported = name in ("ServingInputReceiver", "PredictOutput")
  if estimator is not None:
    return getattr(estimator.export if exported else estimator, name)
  if exported:
    from estimator_accum.estimator import export  # noqa: PLC0415
    return getattr(export, name)
  if name == "RunConfig":
    from estimator_accum.estimator.run_config import RunConfig  # noqa: PLC0415
    return RunConfig
  return {"EstimatorSpec": EstimatorSpec, "ModeKeys": ModeKeys}[name]
