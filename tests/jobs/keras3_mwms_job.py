"""One worker of a 2-worker MultiWorkerMirroredStrategy job under Keras 3
(`python -m tfconfig launch --workers 2 -- python
tests/jobs/keras3_mwms_job.py --output F`): a custom training loop (Keras
3's `model.fit` does not run under this strategy, keras-team/keras#20585)
trains each case's window at the micro-batch and, on this worker alone,
the big batch on one device; worker 0 writes each case's largest relative
difference, and the update counts, to F as JSON."""

import argparse
import json
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402

K, BIG_BATCH, EXAMPLES = 4, 32, 96


def _cases(keras):
  optimizers = keras.optimizers
  return {
      "adam": (lambda: optimizers.Adam(1e-2), {},
               lambda: optimizers.Adam(1e-2)),
      "momentum": (lambda: optimizers.SGD(0.05, momentum=0.9), {},
                   lambda: optimizers.SGD(0.05, momentum=0.9)),
      "clip_norm": (lambda: optimizers.SGD(0.1), {"clip_norm": 0.05},
                    lambda: optimizers.SGD(0.1, global_clipnorm=0.05)),
      "inner_clipnorm": (lambda: optimizers.Adam(1e-2, global_clipnorm=0.05),
                         {}, lambda: optimizers.Adam(1e-2,
                                                     global_clipnorm=0.05)),
  }


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(EXAMPLES, 5)).astype("float32")
  return x, (x.sum(1, keepdims=True) + 0.3 * rng.normal(
      size=(EXAMPLES, 1))).astype("float32")


def _model(keras):
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((5,)),
                           keras.layers.Dense(8, activation="tanh"),
                           keras.layers.Dense(1)])


def _train(keras, strategy, make_optimizer, batch):
  """The model trained in global batches of `batch`, each worker taking
  its own contiguous share of each."""
  x, y = _data()
  with strategy.scope():
    model = _model(keras)
    optimizer = make_optimizer()
    optimizer.build(model.trainable_variables)
  share = batch // strategy.num_replicas_in_sync  # (one per worker)

  def input_fn(context):
    index = context.input_pipeline_id
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(
        lambda f, y: (f[index * share:(index + 1) * share],
                      y[index * share:(index + 1) * share]))

  @tf.function
  def step(features, labels):
    def replica_step(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(
            model(features, training=True) - labels))
        loss /= strategy.num_replicas_in_sync
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply(grads, model.trainable_variables)
    strategy.run(replica_step, args=(features, labels))

  for features, labels in strategy.distribute_datasets_from_function(
      input_fn):
    step(features, labels)
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  return ([w.numpy() for w in model.weights],
          int(optimizer.iterations.numpy()), int(inner.iterations.numpy()))


def _distance(actual, expected):
  return max(float(np.max(np.abs(a - e))) / max(float(np.max(np.abs(e))),
                                                1e-6)
             for a, e in zip(actual, expected))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", required=True)
  args = parser.parse_args()
  warnings.simplefilter("ignore")
  import keras  # noqa: PLC0415

  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  one_device = tf.distribute.get_strategy()
  results = {"replicas": strategy.num_replicas_in_sync}
  for name, (inner, options, reference) in _cases(keras).items():
    window, micro_batches, updates = _train(
        keras, strategy,
        lambda: estimator_accum.AccumulatingKerasOptimizer(
            inner(), K, **options),  # noqa: B023
        BIG_BATCH // K)
    expected, _, _ = _train(keras, one_device, reference, BIG_BATCH)
    results[name] = {"one_device": _distance(window, expected),
                     "micro_batches": micro_batches, "updates": updates}
    if not options and name != "inner_clipnorm":
      keras_big, _, _ = _train(keras, strategy, reference, BIG_BATCH)
      results[name]["keras_big_batch"] = _distance(window, keras_big)
  if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
    with open(args.output, "w", encoding="utf-8") as f:
      json.dump(results, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
