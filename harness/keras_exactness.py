"""TensorFlow 2 Keras: `model.fit` with AccumulatingKerasOptimizer at k
micro-batches of B against plain Keras at batch k x B, weight by weight.

Every cell trains the same model (a float input and token ids through an
Embedding, whose gradient is tf.IndexedSlices, a tanh layer, 3 logits;
sparse categorical cross-entropy) from the same initial weights on the
same examples in the same order, twice: plain Keras at the big batch, and
the wrapped optimizer at the micro-batch, under the same strategy and
dtype policy. Printed: the largest |accumulated - big batch| over every
weight (and an EMA's averages), relative to the weight's size
(|a - b| / (|b| + 0.1): 1e-5 is numpy's allclose with rtol=1e-5,
atol=1e-6), the updates each made, and whether it is within the
tolerance: 1e-5 in float32.

In mixed_float16 two runs that group the same examples differently round
to float16 in different places (3 backward passes of 4 examples are not
the sums of one of 12), so neither equals the other; each is off float32
training by its own rounding. The test there: the window is no further
from the float32 big batch than 3 times Keras's own mixed_float16 big
batch is (the triangle's 2, for two runs that round as much, with room
for Adam, which amplifies rounding unevenly: measured 0.5 to 1.9 times).

  python harness/keras_exactness.py                  # the whole table
  python harness/keras_exactness.py --strategies one,mirrored \\
      --optimizers adam --precisions float32

MultiWorkerMirroredStrategy cells run 2 processes on loopback (`python -m
tfconfig launch`), each training both models.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402

K, MICRO_BATCH, WINDOWS = 3, 4, 4
VOCAB, IDS, FEATURES, CLASSES = 20, 3, 5, 3
FLOAT32_TOLERANCE = 1e-5
# In mixed_float16 the window may be at most this many times as far from
# float32 big-batch training as Keras's own mixed_float16 big batch is.
MIXED_FACTOR = 3.0


def _schedule():
  # Per update: the big batch's optimizer counts its own steps.
  return tf.keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)


OPTIMIZERS = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1),
    "momentum": lambda: tf.keras.optimizers.SGD(
        _schedule(), momentum=0.9, clipnorm=0.05),
    "adam": lambda: tf.keras.optimizers.Adam(_schedule(),
                                             global_clipnorm=0.1),
    "adamw": lambda: tf.keras.optimizers.AdamW(
        0.05, weight_decay=0.1, clipnorm=0.2, use_ema=True, ema_momentum=0.5),
    "legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(
        _schedule(), clipnorm=0.1),
}
# Keras clips a tf.IndexedSlices gradient by the norm of its values, rows
# repeated within the batch counted apart: not the gradient's norm, which
# the window (deduplicated rows) clips. The optimizers that clip train the
# model with a dense embedding gradient.
CLIPPING = ("momentum", "adam", "adamw", "legacy_adam")
STRATEGIES = ("one", "mirrored", "mwms")
PRECISIONS = ("float32", "mixed_float16")


def make_data(examples, seed=0):
  rng = np.random.RandomState(seed)
  features = {
      "x": rng.normal(size=(examples, FEATURES)).astype(np.float32),
      "ids": rng.randint(0, VOCAB, size=(examples, IDS)).astype(np.int32)}
  labels = rng.randint(0, CLASSES, size=examples).astype(np.int32)
  return features, labels


class _OneHotEmbedding(tf.keras.layers.Layer):
  """An Embedding as a product of one-hot rows: the same function, with a
  dense gradient."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.embeddings = None

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        name="embeddings", shape=[VOCAB, 4],
        initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05))

  def call(self, ids):
    return tf.einsum("biv,vd->bid", tf.one_hot(ids, VOCAB, dtype=self.dtype),
                     tf.cast(self.embeddings, self.dtype))


def make_model(sparse=True):
  """The model, its weights from seed 1; float32 logits. Its embedding is
  Keras's (tf.IndexedSlices gradients) when `sparse`, else one-hot
  products (dense gradients)."""
  tf.keras.utils.set_random_seed(1)
  x = tf.keras.Input((FEATURES,), name="x")
  ids = tf.keras.Input((IDS,), dtype=tf.int32, name="ids")
  embedding = (tf.keras.layers.Embedding(VOCAB, 4, name="embedding") if sparse
               else _OneHotEmbedding(name="embedding"))
  embedded = tf.keras.layers.GlobalAveragePooling1D()(embedding(ids))
  hidden = tf.keras.layers.Dense(16, activation="tanh", name="hidden")(
      tf.keras.layers.Concatenate()([x, embedded]))
  logits = tf.keras.layers.Dense(CLASSES, name="logits")(hidden)
  logits = tf.keras.layers.Activation("linear", dtype="float32")(logits)
  return tf.keras.Model({"x": x, "ids": ids}, logits)


def _compiled(make_optimizer, strategy, sparse):
  """The model compiled with `make_optimizer()`, both made in the
  strategy's scope, as Keras asks."""
  with strategy.scope():
    model = make_model(sparse)
    model.compile(optimizer=make_optimizer(), loss=tf.keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))
  return model


def _dataset(data, batch, workers):
  """The examples in order, in global batches of `batch`; with several
  workers each reads the same dataset and takes its share of each batch."""
  dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch)
  if workers > 1:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    dataset = dataset.with_options(options)
  return dataset


def _weights(model):
  """{name: value} of the model's weights and of the EMA an optimizer
  keeps of them."""
  values = {w.name: w.numpy() for w in model.weights}
  optimizer = model.optimizer
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  if getattr(inner, "use_ema", False):
    for variable, average in zip(
        model.trainable_variables,
        inner._model_variables_moving_average):  # noqa: SLF001
      values[variable.name + "/ema"] = average.numpy()
  return values


def train_pair(optimizer_name, strategy, policy, k=K, micro_batch=MICRO_BATCH,
               windows=WINDOWS, train_big=True, **window_options):
  """Trains plain Keras at the big batch (unless not `train_big`: its
  weights and updates are then None) and the wrapper at the micro-batch
  (given `window_options`).

  Returns:
    (big-batch weights, accumulated weights, {"big": updates,
    "accumulated": (micro-batches, updates)}).
  """
  tf.keras.mixed_precision.set_global_policy(policy)
  try:
    replicas = strategy.num_replicas_in_sync
    workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get(
        "cluster", {}).get("worker", [])) or 1
    data = make_data(replicas * k * micro_batch * windows)
    sparse = optimizer_name not in CLIPPING
    big = None
    if train_big:
      big = _compiled(OPTIMIZERS[optimizer_name], strategy, sparse)
      big.fit(_dataset(data, replicas * k * micro_batch, workers), epochs=1,
              verbose=0)
    accumulated = _compiled(
        lambda: estimator_accum.AccumulatingKerasOptimizer(
            OPTIMIZERS[optimizer_name](), k=k, **window_options), strategy,
        sparse)
    accumulated.fit(_dataset(data, replicas * micro_batch, workers),
                    epochs=1, verbose=0)
    counts = {"big": (None if big is None else
                      int(big.optimizer.iterations.numpy())),
              "accumulated": (
                  int(accumulated.optimizer.iterations.numpy()),
                  int(accumulated.optimizer.inner_optimizer.iterations
                      .numpy()))}
    return (None if big is None else _weights(big), _weights(accumulated),
            counts)
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")


_MIRRORED = []


def mirrored_strategy():
  """The process's one MirroredStrategy over 2 logical CPUs: each new one
  starts its collectives' keys again, and a program of one strategy's
  then meets another's cached instance (a shape mismatch that aborts
  every collective after it)."""
  if not _MIRRORED:
    _MIRRORED.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
  return _MIRRORED[0]


def relative_difference(actual, expected):
  """The largest |a - b| / (|b| + 0.1) over every weight: <= 1e-5 is
  numpy's allclose(a, b, rtol=1e-5, atol=1e-6)."""
  return max(float(np.max(np.abs(actual[n] - expected[n]) /
                          (np.abs(expected[n]) + 0.1)))
             for n in expected)


def mwms_cells(optimizer_names, policies, directory):
  """Runs every (optimizer, policy) cell on one cluster of 2 workers, one
  after another in the same processes (a cluster's start is most of a
  small cell's cost); {(optimizer, policy): worker 0's train_pair}."""
  output = os.path.join(directory, "mwms_cells.npz")
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--timeout", "300", "--", sys.executable, os.path.abspath(__file__),
       "--task", "mwms", "--optimizers", ",".join(optimizer_names),
       "--precisions", ",".join(policies), "--output", output],
      cwd=ROOT, capture_output=True, text=True)
  if result.returncode != 0 or not os.path.exists(output):
    raise RuntimeError(f"mwms {optimizer_names} {policies} failed:\n"
                       f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
  stored = np.load(output, allow_pickle=True)
  return {(name, policy): tuple(stored[f"{name}/{policy}/{part}"].item()
                                for part in ("big", "accumulated", "counts"))
          for name in optimizer_names for policy in policies}


def _run_task(args):
  """One worker of an MWMS cluster: trains both models of every cell in
  turn under one strategy; worker 0 saves them."""
  warnings.simplefilter("ignore")
  tf.get_logger().setLevel("ERROR")
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  cells = {}
  for name in args.optimizers.split(","):
    for policy in args.precisions.split(","):
      for part, value in zip(("big", "accumulated", "counts"),
                             train_pair(name, strategy, policy)):
        cells[f"{name}/{policy}/{part}"] = value
  if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
    np.savez(args.output, **cells)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", choices=["mwms"])
  parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
  parser.add_argument("--strategies", default=",".join(STRATEGIES))
  parser.add_argument("--precisions", default=",".join(PRECISIONS))
  parser.add_argument("--output")
  args = parser.parse_args()
  if args.task:
    _run_task(args)
    return 0
  warnings.simplefilter("ignore")
  tf.get_logger().setLevel("ERROR")
  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  for name, values, known in (
      ("optimizer", args.optimizers, OPTIMIZERS),
      ("strategy", args.strategies, STRATEGIES),
      ("precision", args.precisions, PRECISIONS)):
    unknown = set(values.split(",")) - set(known)
    if unknown:
      parser.error(f"unknown {name} {sorted(unknown)}; known: {list(known)}")
  print(f"k={K} micro-batches of {MICRO_BATCH} per replica against one "
        f"batch of k x {MICRO_BATCH} per replica, {WINDOWS} updates; "
        "relative differences (|a - b| / (|b| + 0.1), the largest)")
  print("| optimizer | strategy | precision | window vs big batch | window "
        "vs float32 big batch | Keras's big batch vs float32 | updates (big "
        "/ window) | within |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  failed = 0
  with tempfile.TemporaryDirectory(prefix="keras_exactness_") as directory:
    for optimizer_name in args.optimizers.split(","):
      for strategy_name in args.strategies.split(","):
        reference = None
        for policy in args.precisions.split(","):
          if strategy_name == "mwms":
            big, accumulated, counts = mwms_cells(
                [optimizer_name], [policy], directory)[optimizer_name, policy]
          else:
            strategy = (mirrored_strategy() if strategy_name == "mirrored"
                        else tf.distribute.get_strategy())
            big, accumulated, counts = train_pair(optimizer_name, strategy,
                                                  policy)
          difference = relative_difference(accumulated, big)
          if policy == "float32":
            reference = big
            within = difference <= FLOAT32_TOLERANCE
            cells = ("-", "-")
          elif reference is None:
            within = False  # (run with float32 too, for the reference)
            cells = ("no float32 run", "-")
          else:
            ours = relative_difference(accumulated, reference)
            keras = relative_difference(big, reference)
            within = ours <= MIXED_FACTOR * keras
            cells = (f"{ours:.2e}", f"{keras:.2e}")
          failed += not within
          print(f"| {optimizer_name} | {strategy_name} | {policy} | "
                f"{difference:.2e} | {cells[0]} | {cells[1]} | "
                f"{counts['big']} / {counts['accumulated'][1]} | "
                f"{'yes' if within else 'NO'} |", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
