"""Trains the housing regressor with and without gradient accumulation.

  python -m models.housing                 # micro-batch 8, k=4, vs batch 32
  python -m models.housing --k 8 --batch 4 --epochs 100
  python -m tfconfig launch --workers 2 -- \
      python -m models.housing --strategy multi_worker --k 2

Both runs see the same examples in the same order; the script prints the
effective batch, the eval RMSE of each run (in $1000s) and the largest
relative difference between their weights. With --strategy multi_worker
(under a TF_CONFIG cluster) it trains once, each worker on its shard, and
worker 0 prints the eval RMSE.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# First: TensorFlow loaded with its load-time lines held back.
from models import quiet_import  # noqa: E402, F401, I001
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import estimator_accum  # noqa: E402

from data import housing  # noqa: E402
from estimator_accum.distribution import health  # noqa: E402
from models import console, export, strategies, training  # noqa: E402
from models.housing.model import model_fn  # noqa: E402
from models.script_flags import FlagValues  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_bool("verbose", False, "Show TensorFlow's INFO lines and "
                  "deprecation notices too (set TF_CPP_MIN_LOG_LEVEL=0 for "
                  "its C++ ones).")
flags.DEFINE_integer("k", 4, "Micro-batches per update (>= 1).")
flags.DEFINE_integer("batch", 8, "Examples per micro-batch.")
flags.DEFINE_integer("epochs", 60, "Passes over the training set.")
flags.DEFINE_float("learning_rate", 0.02, "Momentum optimizer step size.")
flags.DEFINE_string("model_dir", None, "Where to write runs; default a "
                    "temporary directory.")
flags.DEFINE_string("data_csv", None, "Housing CSV; default the one in the "
                    "mlxtend package.")
flags.DEFINE_string("export_dir", None, "Also write the accumulated run's "
                    "model as a SavedModel for serving under this directory "
                    "(serving_default: features float32 [batch, 13] -> "
                    "price).")
flags.DEFINE_enum("strategy", "none", ["none", "multi_worker"],
                  "multi_worker: the cluster from TF_CONFIG; trains once.")
training.define_checkpoint_flags(flags, every_n_micro_batches=500)


def train_and_evaluate(values, model_dir, train, evaluation, k, micro_batch,
                       strategy=None):
  """Trains and evaluates one configuration in `model_dir`, holding it
  (training.guarded_run); returns (metrics, weights)."""
  with training.guarded_run("housing", model_dir):
    return _train_and_evaluate(values, model_dir, train, evaluation, k,
                               micro_batch, strategy)


def _train_and_evaluate(values, model_dir, train, evaluation, k, micro_batch,
                        strategy):
  estimator = training.estimator(
      model_fn, model_dir=model_dir,
      config=estimator_accum.RunConfig(
          tf_random_seed=0, train_distribute=strategy,
          log_step_count_steps=10_000,
          save_checkpoints_steps=values.save_checkpoints_steps,
          keep_checkpoint_max=values.keep_checkpoint_max),
      params=dict(k=k, learning_rate=values.learning_rate))

  def train_input(input_context=None):
    return housing.input_fn(train, micro_batch, k=k, epochs=values.epochs,
                            shuffle_seed=0, input_context=input_context)

  if strategy is None:
    estimator.train(train_input)
  else:
    workers = strategy.num_replicas_in_sync
    window = workers * micro_batch * k
    steps = values.epochs * (len(train["price"]) // window) * k
    estimator_accum.train_and_evaluate(
        estimator, estimator_accum.TrainSpec(train_input, max_steps=steps),
        estimator_accum.EvalSpec(train_input, steps=1, start_delay_secs=0,
                                 throttle_secs=0))
    training.remove_own_worker_checkpoints(model_dir)
  metrics = estimator.evaluate(lambda: housing.input_fn(evaluation, 64))
  training.check_finite("housing", metrics)
  weights = {name: estimator.get_variable_value(name)
             for name in ("linear/kernel", "linear/bias")}
  return metrics, weights


def main(argv):
  del argv
  values = FlagValues.of(FLAGS)  # The flags, read once.
  console.quiet_tensorflow(values.verbose)
  if values.k < 1:
    raise app.UsageError(f"--k must be >= 1, got {values.k}")
  if values.batch < 1:
    raise app.UsageError(f"--batch must be >= 1, got {values.batch}")
  train, evaluation = housing.load_housing(values.data_csv)
  model_dir = values.model_dir or training.default_model_dir("housing")
  if values.strategy == "multi_worker":
    _multi_worker(values, model_dir, train, evaluation)
    return
  big_batch = values.k * values.batch
  print(f"housing: {len(train['price'])} train / {len(evaluation['price'])} "
        f"eval examples; effective batch {big_batch} = micro-batch "
        f"{values.batch} x k={values.k}; runs in {model_dir}", flush=True)
  accumulated, accumulated_weights = training.exit_if_diverged(
      "housing", train_and_evaluate, values,
      os.path.join(model_dir, f"accumulated_b{values.batch}_k{values.k}"),
      train, evaluation, values.k, values.batch)
  if values.export_dir:
    _export(values, os.path.join(
        model_dir, f"accumulated_b{values.batch}_k{values.k}"), train)
  plain, plain_weights = train_and_evaluate(
      values, os.path.join(model_dir, f"plain_b{big_batch}"), train, evaluation, 1,
      big_batch)
  worst = max(
      float(np.max(np.abs(accumulated_weights[n] - plain_weights[n]) /
                   np.maximum(np.abs(plain_weights[n]), 1e-6)))
      for n in plain_weights)
  print(f"accumulated (batch {values.batch} x k={values.k}): eval RMSE "
        f"{accumulated['rmse']:.3f}, {accumulated['global_step']} "
        "micro-batches")
  print(f"plain       (batch {big_batch}):      eval RMSE "
        f"{plain['rmse']:.3f}, {plain['global_step']} steps")
  print(f"largest relative weight difference: {worst:.2e}")


def _export(values, run_dir, train):
  path = export.export_tensor_model(
      model_fn, run_dir, values.export_dir, "features",
      train["x"].shape[1:], params=dict(k=values.k,
                                        learning_rate=values.learning_rate))
  print(f"exported for serving to {path} (serving_default: features float32 "
        f"[batch, {train['x'].shape[1]}] -> price)", flush=True)


def _multi_worker(values, model_dir, train, evaluation):
  try:
    # A lost peer ends this task in bounded time instead of a hang; the
    # markers need the model_dir the tasks share (not a temporary one each).
    distribution = strategies.choose("multi_worker", values.model_dir,
                                     health.DEFAULT_TIMEOUT)
  except strategies.StrategyError as error:
    raise SystemExit(f"housing: error: {error}") from None
  workers = distribution.workers * distribution.replicas_per_worker
  batch, k = values.batch, values.k
  print(f"housing: effective batch {workers * batch * k} = "
        f"{workers} worker(s) x micro-batch {batch} x k={k}; "
        f"runs in {model_dir}", flush=True)
  metrics, _ = training.exit_if_diverged(
      "housing", train_and_evaluate, values,
      os.path.join(model_dir, f"b{batch}_k{k}_w{workers}"),
      train, evaluation, k, batch, distribution.strategy)
  if distribution.task.get("index", 0) == 0:
    print(f"eval RMSE {metrics['rmse']:.3f} after {metrics['global_step']} "
          f"micro-batches", flush=True)
  distribution.finish()


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
