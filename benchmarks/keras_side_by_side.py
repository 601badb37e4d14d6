"""TensorFlow 2 Keras, side by side in one run: AccumulatingKerasOptimizer,
gradient-accumulator 0.5.2 (its optimizer wrapper and its model wrapper)
and plain Keras at the micro-batch, each against plain Keras at the big
batch.

The data of harness/keras_exactness.py; a model of token ids through an
Embedding and a float input, two tanh layers of --width (1024: 1.1M
parameters), 3 logits; k=4 micro-batches of 8, 6 updates, one device, from the same initial weights on the same
examples in the same order. Printed per optimizer: the largest relative
difference from the big batch's weights (|a - b| / (|b| + 0.1); 1e-5 is
numpy's allclose at rtol=1e-5, atol=1e-6), the inner optimizer's updates,
and the median time per micro-batch (per step of plain Keras), over the
steps after the first window, measured by a callback around each step.

  python benchmarks/keras_side_by_side.py [--rounds 3]

gradient-accumulator is installed by setup.sh (requirements-benchmarks.txt).
"""

import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import bench  # noqa: E402
from harness import keras_exactness as kx  # noqa: E402

K, MICRO_BATCH, UPDATES = 4, 8, 6
OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
    "momentum": lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
}


class _StepTimes(tf.keras.callbacks.Callback):
  def __init__(self):
    super().__init__()
    self.times, self._start = [], None

  def on_train_batch_begin(self, batch, logs=None):
    self._start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.times.append(time.perf_counter() - self._start)


def make_model(width):
  """Token ids through an Embedding (tf.IndexedSlices gradients) and a
  float input, two tanh layers of `width`, 3 logits; weights from seed 1."""
  tf.keras.utils.set_random_seed(1)
  x = tf.keras.Input((kx.FEATURES,), name="x")
  ids = tf.keras.Input((kx.IDS,), dtype=tf.int32, name="ids")
  embedded = tf.keras.layers.GlobalAveragePooling1D()(
      tf.keras.layers.Embedding(kx.VOCAB, 64, name="embedding")(ids))
  net = tf.keras.layers.Concatenate()([x, embedded])
  for i in range(2):
    net = tf.keras.layers.Dense(width, activation="tanh", name=f"hidden{i}")(
        net)
  logits = tf.keras.layers.Dense(kx.CLASSES, name="logits")(net)
  return tf.keras.Model({"x": x, "ids": ids}, logits)


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _train(variant, optimizer_name, data, width):
  """(weights, updates, seconds per step) of one variant."""
  import gradient_accumulator as ga

  inner = OPTIMIZERS[optimizer_name]()
  model = make_model(width)
  batch = MICRO_BATCH
  if variant == "big batch":
    batch = K * MICRO_BATCH
  elif variant == "estimator_accum":
    inner = estimator_accum.AccumulatingKerasOptimizer(inner, k=K)
  elif variant == "gradient-accumulator optimizer":
    inner = ga.GradientAccumulateOptimizer(optimizer=inner, accum_steps=K)
  elif variant == "gradient-accumulator model":
    model = ga.GradientAccumulateModel(accum_steps=K, inputs=model.inputs,
                                       outputs=model.outputs)
  model.compile(optimizer=inner, loss=_loss())
  timer = _StepTimes()
  model.fit(tf.data.Dataset.from_tensor_slices(data).batch(batch), verbose=0,
            callbacks=[timer])
  skip = 1 if variant in ("big batch", "micro-batch") else K
  seconds = statistics.median(timer.times[skip:])
  updates = _updates(model.optimizer, variant)
  return {w.name: w.numpy() for w in model.weights}, updates, seconds


def _updates(optimizer, variant):
  if variant == "estimator_accum":
    return int(optimizer.inner_optimizer.iterations.numpy())
  if variant == "gradient-accumulator optimizer":
    # Its iterations count micro-batches; the inner optimizer steps on
    # each of them (with zero gradients in between).
    return int(optimizer.optimizer.iterations.numpy())
  return int(optimizer.iterations.numpy())


VARIANTS = ("estimator_accum", "gradient-accumulator optimizer",
            "gradient-accumulator model", "micro-batch")


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--rounds", type=int, default=1,
                      help="each variant this many times; the medians")
  parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
  parser.add_argument("--width", type=int, default=1024)
  args = parser.parse_args()
  warnings.simplefilter("ignore")
  tf.get_logger().setLevel("ERROR")
  data = kx.make_data(K * MICRO_BATCH * UPDATES)
  difference, steps = ("max relative difference from the big batch",
                       "inner optimizer steps")
  milliseconds = ("ms per step (a micro-batch; the big batch's: k of them)")
  table = bench.Rows(
      f"k={K} micro-batches of {MICRO_BATCH} against one batch of "
      f"{K * MICRO_BATCH}, {UPDATES} updates, one device; times: medians "
      f"over {args.rounds} round(s)", args.json, markdown=True,
      formats={difference: ".1e", milliseconds: ".1f"})
  for optimizer_name in args.optimizers.split(","):
    rows = {}
    for _ in range(args.rounds):
      big, big_updates, big_seconds = _train("big batch", optimizer_name,
                                             data, args.width)
      rows.setdefault("big batch", []).append(
          (0.0, big_updates, big_seconds))
      for variant in VARIANTS:
        weights, updates, seconds = _train(variant, optimizer_name, data,
                                           args.width)
        rows.setdefault(variant, []).append(
            (kx.relative_difference(weights, big), updates, seconds))
    for variant, results in rows.items():
      table.add(**{
          "optimizer": optimizer_name, "variant": variant,
          difference: float(results[-1][0]), steps: results[-1][1],
          milliseconds: statistics.median(r[2] for r in results) * 1e3})
  return table.exit_code()


if __name__ == "__main__":
  sys.exit(main())
