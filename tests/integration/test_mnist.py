"""MNIST: the idx reader, accumulated vs plain training weight for weight,
the four example variants (one or two worker processes, with and without
accumulation), and the loss-curve picture."""

import gzip
import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from data import mnist
from models import plot_runs
from models.mnist.model import weight_names
from tests.helpers import planner_support

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

TIMEOUT = 240


def _write_idx(path, magic, array, truncate=0):
  header = struct.pack(">I", magic) + struct.pack(
      f">{array.ndim}I", *array.shape)
  data = header + array.astype(np.uint8).tobytes()
  with gzip.open(path, "wb") as writer:
    writer.write(data[:len(data) - truncate])


def _write_pair(directory, prefix, images, labels, **kwargs):
  _write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", mnist.IMAGE_MAGIC,
             images, **kwargs)
  _write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", mnist.LABEL_MAGIC,
             labels)


def _mnist(*args, timeout=TIMEOUT):
  return subprocess.run([sys.executable, "-m", "models.mnist", *args],
                        capture_output=True, text=True, timeout=timeout)


def test_idx_files_read_back(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(5, 28, 28))
  labels = np.array([3, 1, 4, 1, 5])
  _write_pair(tmp_path, "train", images, labels)
  data = mnist.read_idx_pair(tmp_path / "train-images-idx3-ubyte.gz",
                             tmp_path / "train-labels-idx1-ubyte.gz")
  np.testing.assert_allclose(data["images"][..., 0], images / 255.0,
                             rtol=1e-6)
  np.testing.assert_array_equal(data["labels"], labels)


@pytest.mark.parametrize("damage, message", [
    ("truncated", r"train-images-idx3-ubyte.gz: 7843 bytes, but its header "
                  r"\(10, 28, 28\) needs 7856 \(truncated or padded\)"),
    ("magic", r"train-images-idx3-ubyte.gz: magic number 2049, expected "
              r"2051 \(images idx file\)"),
])
def test_bad_idx_file_gets_one_clear_line(damage, message, tmp_path):
  images = np.zeros((10, 28, 28))
  labels = np.zeros(10)
  if damage == "truncated":
    _write_pair(tmp_path, "train", images, labels, truncate=13)
  else:
    _write_pair(tmp_path, "train", images, labels)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", mnist.LABEL_MAGIC,
               images)
  _write_pair(tmp_path, "t10k", images, labels)
  with pytest.raises(mnist.MnistFileError, match=message):
    mnist.read_idx_images(tmp_path / "train-images-idx3-ubyte.gz")
  result = _mnist("--idx_dir", str(tmp_path))
  assert result.returncode != 0
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("mnist: error: ") and re.search(
      message, last), result.stderr[-2000:]


def test_offline_csv_is_mixed_before_the_split():
  train, test = mnist.load()
  assert train["images"].shape == (4000, 28, 28, 1)
  assert sorted(set(test["labels"])) == list(range(10))
  assert 0.0 <= train["images"].min() and train["images"].max() <= 1.0


@pytest.mark.estimator
def test_one_epoch_accumulated_equals_big_batch_weights(tmp_path):
  # An epoch of the first 1,024 images: 32 updates show what 125 did, in a
  # quarter of the CPU.
  result = _mnist("--model_dir", str(tmp_path), "--k", "4", "--batch", "8",
                  "--train_size", "1024")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "effective batch 32 = 1 worker(s) x micro-batch 8 x k=4" in (
      result.stdout)
  accumulated = tf.train.load_checkpoint(str(tmp_path / "b8_k4"))
  plain = tf.train.load_checkpoint(str(tmp_path / "b32_k1"))
  assert accumulated.get_tensor("global_step") == 128
  assert plain.get_tensor("global_step") == 32
  for name in weight_names():
    np.testing.assert_allclose(accumulated.get_tensor(name),
                               plain.get_tensor(name), rtol=1e-5, atol=1e-6,
                               err_msg=name)


@pytest.mark.estimator
@pytest.mark.parametrize("k", [1, 2])
def test_multi_worker_variants(k, tmp_path):
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
             "--timeout", str(TIMEOUT), "--", sys.executable, "-m",
             "models.mnist", "--strategy", "multi_worker", "--k", str(k),
             "--batch", "8", "--train_size", "64", "--model_dir",
             str(tmp_path), "--nocompare"]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=TIMEOUT + 30)
  assert result.returncode == 0, result.stdout[-4000:]
  name = f"b8_k{k}_w2"
  assert (f"[worker:0] mnist: 64 train / 1000 test images; effective batch "
          f"{16 * k} = 2 worker(s)") in result.stdout
  assert f"[worker:0] {name}: test accuracy" in result.stdout
  # 64 examples / (2 workers x 8) = 4 micro-batch steps, whole windows.
  assert tf.train.load_checkpoint(str(tmp_path / name)).get_tensor(
      "global_step") == 4


@pytest.mark.estimator
def test_single_worker_variants_and_their_loss_plot(tmp_path):
  """One worker with (k=2) and without (k=1) accumulation at the same
  effective batch, then the picture of both runs' losses."""
  for k, batch in ((2, 8), (1, 16)):
    result = _mnist("--model_dir", str(tmp_path), "--k", str(k), "--batch",
                    str(batch), "--train_size", "320", "--nocompare")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "effective batch 16 = 1 worker(s)" in result.stdout
    assert f"b{batch}_k{k}: test accuracy" in result.stdout
  output = tmp_path / "loss.png"
  result = subprocess.run(
      [sys.executable, "-m", "models.plot_runs", "--output", str(output),
       str(tmp_path / "b8_k2"), str(tmp_path / "b16_k1")],
      capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "(2 runs)" in result.stdout
  # What the picture draws for the k=2 run, each window's mean loss, is
  # the loss of batch 16 on the same examples at the same weights.
  windows = plot_runs.window_means(
      plot_runs.read_scalars(str(tmp_path / "b8_k2")), 2)
  plain = plot_runs.read_scalars(str(tmp_path / "b16_k1"))
  assert len(windows) == len(plain) == 20
  np.testing.assert_allclose([v for _, v in windows], [v for _, v in plain],
                             rtol=1e-4)
  with Image.open(output) as image:
    assert image.format == "PNG" and image.size == (800, 500)
    assert len(image.getcolors(maxcolors=100_000) or []) > 10
  result = subprocess.run(
      [sys.executable, "-m", "models.plot_runs", str(tmp_path / "missing")],
      capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode != 0
  assert "no run_info.json" in result.stderr.strip().splitlines()[-1]


def _measured_peaks_mb(effective_batch, tmp_path):
  """{micro-batch: peak MB} as the script measures them here: a budget no
  candidate fits makes it measure every one, print each, and refuse."""
  return planner_support.refused_plan_peaks_mb(_mnist(
      "--model_dir", str(tmp_path / "measure"), "--effective_batch_size",
      str(effective_batch), "--micro_batch_size", "auto",
      "--memory_budget_mb", "0.001", "--train_size", "800"))


@pytest.mark.estimator
@pytest.mark.memory
def test_a_measured_plan_trains_the_big_batch(tmp_path):
  # What MNIST's step holds depends on the CPU's kernels: about 6 MB plus
  # 0.1 MB per example with oneDNN, about 70 MB plus 0.14 with Eigen's
  # (oneDNN off). The budget is set between the peaks measured here at 128
  # and 64, so on either path 128 is too big and 64 fits.
  peaks = _measured_peaks_mb(128, tmp_path)
  assert peaks[128] > peaks[64] > peaks[1], peaks
  budget = (peaks[128] + peaks[64]) / 2 / 0.9
  result = _mnist("--model_dir", str(tmp_path), "--effective_batch_size",
                  "128", "--micro_batch_size", "auto", "--memory_budget_mb",
                  f"{budget:.3f}", "--train_size", "800")
  assert result.returncode == 0, result.stderr[-3000:]
  plan = json.loads((tmp_path / "micro_batch_plan.json").read_text())
  assert plan["micro_batch"] == 64 and plan["k"] == 2, (plan, peaks)
  assert re.search(r"micro-batch +64 \(k=2\): peak .* MB, "
                   r"fits .*<- chosen", result.stdout), result.stdout
  assert re.search(r"micro-batch +128 \(k=1\): peak .* MB, too big",
                   result.stdout), result.stdout
  accumulated = tf.train.load_checkpoint(str(tmp_path / "b64_k2"))
  plain = tf.train.load_checkpoint(str(tmp_path / "b128_k1"))
  for name in weight_names():
    np.testing.assert_allclose(accumulated.get_tensor(name),
                               plain.get_tensor(name), rtol=1e-5, atol=1e-6,
                               err_msg=name)


def _keras_example(*flags):
  result = subprocess.run(
      [sys.executable, "-m", "models.mnist.keras", "--train_size", "640",
       *flags], capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.keras2
@pytest.mark.parametrize("strategy", ["none", "mirrored"])
def test_the_keras_example_trains_as_the_big_batch(strategy):
  """`python -m models.mnist.keras`: model.fit with the accumulating
  optimizer equals plain Keras at batch k x B, weight for weight."""
  out = _keras_example("--strategy", strategy)
  replicas = 2 if strategy == "mirrored" else 1
  updates = 640 // (replicas * 8 * 4)
  assert f"accumulated: {updates} updates over {4 * updates} micro-batches" \
      in out, out
  assert f"plain Keras at batch {replicas * 32}: {updates} updates" in out
  difference = float(re.search(r"weight difference ([0-9.e+-]+)", out)[1])
  assert difference <= 1e-5, out


@pytest.mark.keras2
def test_the_keras_example_in_mixed_precision():
  """With --mixed_precision the window scales the loss itself (Keras's
  compile does not wrap it): the dynamic scale starts at 2**15."""
  out = _keras_example("--mixed_precision", "--nocompare", "--train_size",
                       "160")  # (the last --train_size counts)
  assert "mixed_float16" in out
  assert "loss scale 32768" in out, out
  assert "accumulated: 5 updates over 20 micro-batches" in out, out
