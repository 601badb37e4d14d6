"""A checkpoint whose index or data cannot be read whole is skipped, named,
and the directory's state points at the newest complete one: each fault
made for real in files a Saver wrote (truncated data, a missing shard, a
bit flipped in the index or the data, an empty state file)."""

import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.checkpoints import integrity

STEPS = (10, 20, 30)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A directory with a Saver's checkpoints at steps 10, 20 and 30 of two
  variables (a of 300,000 floats, b of 1,000), a = step + arange."""
  directory = tmp_path_factory.mktemp("saved")
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    a = tf.compat.v1.get_variable(
        "a", initializer=tf.zeros([300_000]), use_resource=True)
    tf.compat.v1.get_variable("b", initializer=tf.ones([1000]))
    advance = tf.group(step.assign_add(10), a.assign(
        tf.cast(step + 10, tf.float32) + tf.range(300_000, dtype=tf.float32)))
    saver = tf.compat.v1.train.Saver(max_to_keep=3)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in STEPS:
        session.run(advance)
        saver.save(session, str(directory / "model.ckpt"), global_step=step)
  return directory


@pytest.fixture
def copy(saved, tmp_path):
  target = tmp_path / "run"
  shutil.copytree(saved, target)
  return target


def _flip(path, at):
  data = bytearray(path.read_bytes())
  data[at] ^= 0x10
  path.write_bytes(bytes(data))


def _data(directory, step):
  return directory / f"model.ckpt-{step}.data-00000-of-00001"


FAULTS = {
    "truncated_data": (
        lambda d: os.truncate(_data(d, 30), 500_000),
        r"its data is cut short \(model\.ckpt-30\.data-00000-of-00001 500000 "
        r"bytes\): tensor 'a' cannot be read whole"),
    "missing_shard": (
        lambda d: _data(d, 30).unlink(),
        r"a data shard of .*model\.ckpt-30 is missing"),
    "index_bit_flip": (
        lambda d: _flip(d / "model.ckpt-30.index",
                        (d / "model.ckpt-30.index").stat().st_size // 2),
        r"model\.ckpt-30\.index cannot be read \(.*checksum"),
    "data_bit_flip": (
        lambda d: _flip(_data(d, 30), 1000),
        r"tensor 'a' cannot be read \(.*Checksum does not match"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_newest_checkpoint_is_skipped_and_named(copy, fault):
  inject, named = FAULTS[fault]
  inject(copy)
  lines = []
  newest = integrity.resume_from_complete(str(copy), report=lines.append)
  assert newest == str(copy / "model.ckpt-20")
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"skipping checkpoint {copy / 'model.ckpt-30'}: ")
  assert re.search(named, lines[0]), lines[0]
  # What Estimator and a Saver restore now: the complete one, whole.
  assert tf.train.latest_checkpoint(str(copy)) == newest
  restored = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(copy)))
  assert restored.get_tensor("global_step") == 20
  np.testing.assert_array_equal(restored.get_tensor("a")[:3], [20, 21, 22])
  state = tf.train.get_checkpoint_state(str(copy))
  assert list(state.all_model_checkpoint_paths) == [
      str(copy / "model.ckpt-10"), str(copy / "model.ckpt-20")]
  # The bad files stay where they were, for the user to look at.
  assert (copy / "model.ckpt-30.index").exists()


def test_an_empty_state_file_is_written_again(copy):
  (copy / "checkpoint").write_text("")
  with pytest.raises(ValueError):
    tf.train.get_checkpoint_state(str(copy))  # what Estimator met
  lines = []
  assert integrity.resume_from_complete(
      str(copy), report=lines.append) == str(copy / "model.ckpt-30")
  assert not lines
  assert tf.train.latest_checkpoint(str(copy)) == str(copy / "model.ckpt-30")


def test_a_copied_directory_restores_its_own_files(copy, saved):
  # A Saver given an absolute path writes absolute paths: the copy's state
  # names the original's files, which TensorFlow would restore.
  assert tf.train.latest_checkpoint(str(copy)) == str(saved / "model.ckpt-30")
  assert integrity.resume_from_complete(str(copy)) == str(
      copy / "model.ckpt-30")
  assert tf.train.latest_checkpoint(str(copy)) == str(copy / "model.ckpt-30")
  assert list(tf.train.get_checkpoint_state(
      str(copy)).all_model_checkpoint_paths) == [
          str(copy / f"model.ckpt-{step}") for step in STEPS]


def test_a_complete_newest_leaves_the_state_as_it_is(saved):
  before = (saved / "checkpoint").read_bytes()
  assert integrity.resume_from_complete(str(saved)) == str(
      saved / "model.ckpt-30")
  assert (saved / "checkpoint").read_bytes() == before


def test_none_complete_is_one_error_naming_each(copy):
  for step in STEPS:
    os.truncate(_data(copy, step), 100)
  with pytest.raises(integrity.NoCompleteCheckpoint) as raised:
    integrity.resume_from_complete(str(copy))
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"no checkpoint in {copy} is complete (")
  for step in STEPS:
    assert f"model.ckpt-{step}: its data is cut short" in message


def test_a_directory_without_checkpoints_starts_anew(tmp_path):
  assert integrity.resume_from_complete(str(tmp_path / "absent")) is None
  (tmp_path / "empty").mkdir()
  assert integrity.resume_from_complete(str(tmp_path / "empty")) is None
  # A save cut short by a full disk leaves its _temp folder: no checkpoint.
  (tmp_path / "temp" / "model.ckpt-30_temp").mkdir(parents=True)
  (tmp_path / "temp" / "model.ckpt-30_temp" / "part-00000-of-00001.index"
   ).write_bytes(b"\0" * 10)
  assert integrity.resume_from_complete(str(tmp_path / "temp")) is None


def test_problem_of_a_complete_checkpoint_is_none(saved):
  for step in STEPS:
    assert integrity.problem(str(saved / f"model.ckpt-{step}")) is None
  assert integrity.problem(str(saved / "model.ckpt-40")) == (
      f"{saved / 'model.ckpt-40'}.index is missing")


def test_a_checkpoint_managers_directory_resumes_from_its_newest_complete(
    tmp_path):
  """tf.train.CheckpointManager's directories (Keras's BackupAndRestore
  keeps its backup in one, object-based checkpoints "ckpt-N"): the same
  check, and a new manager restores the complete one."""
  step = tf.Variable(0)
  weights = tf.Variable(tf.zeros([50_000]))
  checkpoint = tf.train.Checkpoint(step=step, weights=weights)
  manager = tf.train.CheckpointManager(checkpoint, str(tmp_path),
                                       max_to_keep=3)
  for value in (1, 2, 3):
    step.assign(value)
    weights.assign(tf.fill([50_000], float(value)))
    manager.save()
  newest = tmp_path / "ckpt-3.data-00000-of-00001"
  os.truncate(newest, newest.stat().st_size // 2)
  lines = []
  assert integrity.resume_from_complete(
      str(tmp_path), report=lines.append) == str(tmp_path / "ckpt-2")
  assert lines and lines[0].startswith(
      f"skipping checkpoint {tmp_path / 'ckpt-3'}: its data is cut short")
  restored = tf.train.Checkpoint(step=tf.Variable(0),
                                 weights=tf.Variable(tf.zeros([50_000])))
  again = tf.train.CheckpointManager(restored, str(tmp_path), max_to_keep=3)
  again.restore_or_initialize()
  assert int(restored.step.numpy()) == 2
  assert float(restored.weights.numpy()[0]) == 2.0
