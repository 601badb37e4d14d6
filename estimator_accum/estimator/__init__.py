"""The way in for an Estimator model_fn, on every TensorFlow 2.15-2.21:
`Estimator` (estimator.py) over the library's sessions (runner.py,
export.py), `train_and_evaluate` (train_and_evaluate.py), and the types a
model_fn is written with: `EstimatorSpec`, `ModeKeys`, `RunConfig`
(tf.estimator's on 2.15, the library's on 2.16+; specs.py,
run_config.py), `TrainSpec`, `EvalSpec`."""

from estimator_accum.estimator.estimator import Estimator
from estimator_accum.estimator.specs import EvalSpec, TrainSpec
from estimator_accum.estimator.train_and_evaluate import train_and_evaluate

# tf.estimator's on 2.15, the library's on 2.16+; looked up when first
# asked for, so that importing the library does not load tf.estimator.
RELEASE_TYPES = ("EstimatorSpec", "ModeKeys", "PredictOutput", "RunConfig",
                 "ServingInputReceiver")

__all__ = ["Estimator", "EstimatorSpec", "EvalSpec", "ModeKeys",
           "PredictOutput", "RunConfig", "ServingInputReceiver", "TrainSpec",
           "train_and_evaluate"]


def __getattr__(name):
  if name in RELEASE_TYPES:
    from estimator_accum.estimator import specs  # noqa: PLC0415
    return specs.of_this_release(name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
