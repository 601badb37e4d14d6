"""A full disk is told as a full disk: recognised by what the file system
said (TensorFlow's ResourceExhaustedError of a save, Python's OSError),
the saves it cut short removed, one line with the bytes. The whole run on a
tmpfs that fills: tests/integration/test_storage_faults.py."""

import errno
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.checkpoints import full_disk

SAVE_ERROR = tf.errors.ResourceExhaustedError(
    None, None, "/runs/x/model.ckpt-12_temp/part-00000-of-00001.data-00000-of"
    "-00001.tempstate1244; No space left on device\n\t [[{{node save/SaveV2}}"
    "]]")


@pytest.mark.parametrize("error, full", [
    (SAVE_ERROR, True),
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (tf.errors.UnknownError(None, None, "x; Disk quota exceeded"), True),
    (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating "
                                      "tensor with shape[8,128,384]"), False),
    (OSError(errno.EACCES, "Permission denied"), False),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), False),
])
def test_a_full_disk_is_told_from_other_errors(error, full):
  assert full_disk.is_full_disk(error) is full


@pytest.fixture
def run_dir(tmp_path):
  """A directory with a complete checkpoint at 6 and what a save at 12
  that the disk cut short leaves."""
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable("w", initializer=tf.constant(
        np.ones(1000, np.float32)))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(step.assign(6))
      tf.compat.v1.train.Saver().save(session, str(tmp_path / "model.ckpt"),
                                      global_step=step)
  (tmp_path / "model.ckpt-12_temp").mkdir()
  (tmp_path / "model.ckpt-12_temp" / "part-00000-of-00001.index").write_bytes(
      b"\0" * 10)
  (tmp_path / "events.out.tfevents.1.host.tempstate77").write_bytes(b"\0")
  return tmp_path


def test_the_line_names_the_directory_the_bytes_and_the_resume(run_dir):
  line = full_disk.describe(str(run_dir), SAVE_ERROR)
  free = shutil.disk_usage(run_dir).free / 2**20
  size = full_disk.checkpoint_bytes(str(run_dir / "model.ckpt-6")) / 2**20
  assert size > 0
  assert line == (
      f"--output_dir={run_dir}: the disk is full (No space left on device): "
      f"a checkpoint takes {size:.1f} MB (model.ckpt-6), {free:.1f} MB free; "
      f"free space and run again to resume from {run_dir / 'model.ckpt-6'}.")
  # The saves cut short are gone, the complete checkpoint stays.
  assert sorted(os.listdir(run_dir)) == [
      "checkpoint", "model.ckpt-6.data-00000-of-00001", "model.ckpt-6.index",
      "model.ckpt-6.meta"]


def test_with_no_checkpoint_yet_it_says_the_free_space(tmp_path):
  line = full_disk.describe(str(tmp_path), OSError(errno.EDQUOT, "quota"),
                            flag="--model_dir")
  assert line.startswith(f"--model_dir={tmp_path}: the disk is full (Disk "
                         "quota exceeded): ")
  assert line.endswith(" MB free; free space and run again.")


def test_with_no_checkpoint_yet_an_estimate_is_said_as_about(tmp_path):
  line = full_disk.describe(str(tmp_path), SAVE_ERROR,
                            estimate_bytes=363 * 2**20)
  free = shutil.disk_usage(tmp_path).free / 2**20
  assert line == (
      f"--output_dir={tmp_path}: the disk is full (No space left on device): "
      f"a checkpoint takes about 363.0 MB, {free:.1f} MB free; free space "
      "and run again.")


def test_with_a_checkpoint_its_size_is_said_not_the_estimate(run_dir):
  line = full_disk.describe(str(run_dir), SAVE_ERROR, estimate_bytes=1)
  assert "about" not in line and "(model.ckpt-6)" in line


def test_short_of_room_is_said_only_when_it_is(tmp_path):
  free = shutil.disk_usage(tmp_path).free
  assert full_disk.short_of_room(str(tmp_path), 1, 3) is None
  line = full_disk.short_of_room(str(tmp_path / "not_yet"), free, 3)
  assert line.startswith(f"--output_dir={tmp_path / 'not_yet'} has ")
  assert "3 checkpoint(s) of about" in line
  assert line.endswith("the run will stop when the disk is full.")
  # A size not known (no checkpoint to measure it by): nothing said.
  assert full_disk.short_of_room(str(tmp_path / "not_yet"), None, 3) is None
