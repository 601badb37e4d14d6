"""Canned estimators on a small regression, for the wrapper tests; run as a
script, one worker of a MultiWorkerMirroredStrategy job.

`python -m tfconfig launch --workers 2 -- python tests/jobs/canned_job.py
--model_dir D --api keras|v1 --optimizer adam|sgd --k K --micro_batch B
--updates U`: each worker reads its shard (examples w, w+2, ...), so the
workers' micro-batch j covers the examples of slice j of 2*B in order and
window n those of big batch n of 2*k*B. Worker 0 writes the trained
weights to D/final_weights.npz.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum as ea  # noqa: E402

_rng = np.random.RandomState(0)
X = _rng.randn(96, 4).astype(np.float32)
CATEGORY = _rng.randint(0, 20, size=96).astype(np.int64)
Y = (X @ _rng.randn(4, 1) + 0.1 * CATEGORY[:, None]).astype(np.float32)

V1_OPTIMIZERS = {
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1),
}
KERAS_OPTIMIZERS = {
    "adam": lambda: tf.keras.optimizers.legacy.Adam(0.05),
    "sgd": lambda: tf.keras.optimizers.legacy.SGD(0.005),
    "ftrl": lambda: tf.keras.optimizers.legacy.Ftrl(0.1),
}


def input_fn(batch, shard=None):
  """Batches of `batch` examples, repeated; `shard` = (workers, index)."""
  def make_dataset():
    features = {"x": X, "category": CATEGORY}
    dataset = tf.data.Dataset.from_tensor_slices((features, Y))
    if shard is not None:
      dataset = dataset.shard(*shard)
    return dataset.batch(batch).repeat()
  return make_dataset


def canned_estimator(kind, optimizer, model_dir, loss_reduction=None,
                     train_distribute=None, canned=None,
                     session_config=None):
  """A canned regressor ("dnn", "linear", or "wide_deep" with a pair of
  optimizers) from tf.compat.v1.estimator, or `canned`'s."""
  canned = canned or tf.compat.v1.estimator
  numeric = tf.feature_column.numeric_column("x", [4])
  category = tf.feature_column.categorical_column_with_identity("category", 20)
  config = tf.estimator.RunConfig(
      tf_random_seed=3, train_distribute=train_distribute,
      session_config=session_config)
  options = {} if loss_reduction is None else {"loss_reduction": loss_reduction}
  embedded = tf.feature_column.embedding_column(category, 3)
  if kind == "dnn":
    return canned.DNNRegressor(
        [8], [numeric, embedded], model_dir=model_dir, optimizer=optimizer,
        config=config, **options)
  if kind == "linear":
    return canned.LinearRegressor(
        [numeric, category], model_dir=model_dir, optimizer=optimizer,
        config=config, **options)
  # Wide and deep: two optimizers, each minimize()d without a global step
  # (the estimator increments it); the linear part's categorical weights
  # get a sparse gradient.
  linear_optimizer, dnn_optimizer = optimizer
  return tf.compat.v1.estimator.DNNLinearCombinedRegressor(
      model_dir=model_dir, linear_feature_columns=[numeric, category],
      linear_optimizer=linear_optimizer, dnn_feature_columns=[
          numeric, embedded], dnn_optimizer=dnn_optimizer,
      dnn_hidden_units=[8], config=config, **options)


def trained_weights(estimator):
  """The model's weights in `estimator`'s checkpoint: no slots, no state."""
  return {name: estimator.get_variable_value(name)
          for name in estimator.get_variable_names()
          if name.startswith(("dnn/hiddenlayer", "dnn/logits", "dnn/input",
                              "linear/linear_model/", "linear/"))
          and "/Ftrl" not in name and "/training/" not in name
          and not name.endswith(("Adam", "Adam_1", "Ftrl", "Ftrl_1",
                                 "Adagrad"))
          and "/accum" not in name}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--api", choices=["v1", "keras"], default="keras")
  parser.add_argument("--optimizer", choices=sorted(V1_OPTIMIZERS),
                      default="adam")
  parser.add_argument("--k", type=int, default=3)
  parser.add_argument("--micro_batch", type=int, default=4)
  parser.add_argument("--updates", type=int, default=4)
  args = parser.parse_args()
  task = json.loads(os.environ["TF_CONFIG"])["task"]
  workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
  if args.api == "v1":
    optimizer = ea.AccumulatingOptimizer(V1_OPTIMIZERS[args.optimizer](),
                                         args.k)
    canned = tf.compat.v1.estimator
  else:
    make = KERAS_OPTIMIZERS[args.optimizer]
    optimizer = lambda: ea.AccumulatingKerasOptimizer(make(), args.k)  # noqa: E731
    canned = tf.estimator
  estimator = canned_estimator(
      "dnn", optimizer, args.model_dir, canned=canned,
      train_distribute=tf.distribute.MultiWorkerMirroredStrategy())
  tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(
          input_fn(args.micro_batch, (workers, task["index"])),
          max_steps=args.k * args.updates),
      tf.estimator.EvalSpec(input_fn(args.micro_batch), steps=1,
                            start_delay_secs=10**6, throttle_secs=10**6))
  if task["index"] == 0:
    weights = trained_weights(estimator)
    weights["global_step"] = estimator.get_variable_value("global_step")
    weights["updates_applied"] = estimator.get_variable_value(
        "gradient_accumulation/updates_applied")
    np.savez(os.path.join(args.model_dir, "final_weights.npz"), **weights)


if __name__ == "__main__":
  main()
