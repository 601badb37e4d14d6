"""The Keras wrapper's checkpoints (Keras 2: TensorFlow 2.15's tf.keras,
tf-keras on 2.16+) on storage faults made for real in the files Keras
wrote: a `ModelCheckpoint(save_weights_only=True)` directory whose newest
checkpoint is cut short or has a flipped bit resumes, through
`estimator_accum.checkpoints.integrity.resume_from_complete`, from the
newest complete one, named in one line, to the weights of a run that never
wrote the bad one (the window's state included: the epochs end
mid-window); none complete is one line naming each."""

import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum as ea
from estimator_accum.checkpoints import integrity

pytestmark = pytest.mark.keras2

K, B = 4, 8
# 5 micro-batches an epoch: epochs end mid-window (epoch 2 after 10).
EPOCH = 5 * B


def _data():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(EPOCH, 5)).astype(np.float32),
          rng.normal(size=(EPOCH, 1)).astype(np.float32))


def _model():
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh",
                                                     input_shape=(5,)),
                               tf.keras.layers.Dense(1)])
  model.compile(optimizer=ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(1e-2), k=K), loss="mse")
  return model


def _fit(model, epochs, initial_epoch=0, callbacks=()):
  x, y = _data()
  model.fit(x, y, batch_size=B, epochs=epochs, initial_epoch=initial_epoch,
            shuffle=False, verbose=0, callbacks=list(callbacks))
  return model


def _assert_ends_as_one_run(resumed, epochs):
  """`resumed` counts the micro-batches of `epochs` and holds the weights
  of one run of `epochs` that never stopped."""
  whole = _fit(_model(), epochs)
  assert int(resumed.optimizer.iterations) == epochs * EPOCH // B
  for actual, expected in zip(resumed.get_weights(), whole.get_weights()):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def _checkpointed(directory, epochs=3):
  """A run of `epochs` epochs with a checkpoint at each epoch's end."""
  _fit(_model(), epochs, callbacks=[tf.keras.callbacks.ModelCheckpoint(
      os.path.join(directory, "ckpt-{epoch:02d}"), save_weights_only=True)])
  assert tf.train.latest_checkpoint(directory).endswith(f"ckpt-{epochs:02d}")


def _cut_to_half(directory, prefix):
  [data] = tf.io.gfile.glob(os.path.join(directory, f"{prefix}.data-*"))
  os.truncate(data, os.path.getsize(data) // 2)


def _flip_in_index(directory, prefix):
  path = os.path.join(directory, f"{prefix}.index")
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x10
  with open(path, "wb") as file:
    file.write(bytes(data))


FAULTS = {"truncated_data": (_cut_to_half, "its data is cut short"),
          "index_bit_flip": (_flip_in_index, "cannot be read")}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_newest_checkpoint_is_skipped_and_training_goes_on_exactly(
    fault, tmp_path):
  directory = str(tmp_path / "checkpoints")
  _checkpointed(directory)
  make, said = FAULTS[fault]
  make(directory, "ckpt-03")
  lines = []
  newest = integrity.resume_from_complete(directory, report=lines.append)
  assert newest == os.path.join(directory, "ckpt-02")
  assert len(lines) == 1 and lines[0].startswith(
      f"skipping checkpoint {os.path.join(directory, 'ckpt-03')}: "), lines
  assert said in lines[0], lines
  assert tf.train.latest_checkpoint(directory) == newest
  resumed = _model()
  resumed.load_weights(newest)
  _fit(resumed, 4, initial_epoch=2)
  # The window's state came back too: resumed at micro-batch 10, two into
  # the third window, it ends where the whole run's 20 do.
  _assert_ends_as_one_run(resumed, 4)


def test_none_complete_is_one_line_naming_each(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _checkpointed(directory, epochs=2)
  for prefix in ("ckpt-01", "ckpt-02"):
    _cut_to_half(directory, prefix)
  with pytest.raises(integrity.NoCompleteCheckpoint) as raised:
    integrity.resume_from_complete(directory)
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"no checkpoint in {directory} is complete (")
  for prefix in ("ckpt-02", "ckpt-01"):
    assert f"{os.path.join(directory, prefix)}: its data is cut short" in (
        message)


class _StopAfterEpoch(tf.keras.callbacks.Callback):
  """Stops the run (an exception, as a killed process stops it) once the
  backup of epoch `epoch` (1-based) is written."""

  def __init__(self, epoch):
    super().__init__()
    self.epoch = epoch

  def on_epoch_end(self, epoch, logs=None):
    if epoch + 1 == self.epoch:
      raise RuntimeError("stopped")


def _backed_up(backup_dir, epochs=3):
  """A run stopped after `epochs` epochs, each backed up at its end."""
  with pytest.raises(RuntimeError, match="stopped"):
    _fit(_model(), 5, callbacks=[ea.BackupAndRestore(backup_dir),
                                 _StopAfterEpoch(epochs)])
  chief = os.path.join(backup_dir, "chief")
  # The newest two backups are kept (Keras's own keeps one).
  kept = sorted(os.path.basename(path)
                for path in tf.io.gfile.glob(f"{chief}/ckpt-*.index"))
  assert kept == [f"ckpt-{epochs - 1}.index", f"ckpt-{epochs}.index"], kept
  return chief


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_backup_and_restore_skips_a_bad_backup_and_goes_on_exactly(
    fault, tmp_path, caplog):
  """The newest backup (epoch 3) made bad: one warning naming it, and the
  run resumes from the one before (epoch 2, mid-window) to the weights of
  a run that never stopped; Keras's own callback fails there inside
  TensorFlow."""
  backup_dir = str(tmp_path / "backup")
  chief = _backed_up(backup_dir)
  make, said = FAULTS[fault]
  make(chief, "ckpt-3")
  with caplog.at_level("WARNING"):
    resumed = _fit(_model(), 5, callbacks=[ea.BackupAndRestore(backup_dir)])
  skipped = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("skipping checkpoint")]
  assert len(skipped) == 1, skipped
  assert skipped[0].startswith(
      f"skipping checkpoint {os.path.join(chief, 'ckpt-3')}: ") and (
          said in skipped[0]), skipped
  # Resumed after epoch 2, not started anew (which ends at the same
  # weights).
  assert resumed.history.epoch == [2, 3, 4], resumed.history.epoch
  _assert_ends_as_one_run(resumed, 5)


def test_backup_and_restore_with_no_complete_backup_is_one_line(tmp_path):
  backup_dir = str(tmp_path / "backup")
  chief = _backed_up(backup_dir)
  for prefix in ("ckpt-2", "ckpt-3"):
    _cut_to_half(chief, prefix)
  with pytest.raises(integrity.NoCompleteCheckpoint, match=(
      rf"^no checkpoint in {chief} is complete \({chief}/ckpt-3: its data is "
      rf"cut short .*; {chief}/ckpt-2: its data is cut short .*\); restore a "
      r"copy, or remove them to start anew\.$")):
    _fit(_model(), 5, callbacks=[ea.BackupAndRestore(backup_dir)])
