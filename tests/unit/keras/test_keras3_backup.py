"""`BackupAndRestore` under Keras 3 (TensorFlow 2.16+) with
the Keras 3 `AccumulatingKerasOptimizer`, on a backup cut short for real:
one warning naming it and `fit` resumes from the backup before it, to the
weights of a run that never stopped (its epochs end mid-window); none
complete is one line naming each."""

import os

import numpy as np
import pytest

import estimator_accum
from estimator_accum.checkpoints import integrity

# Keras 3's callback, which `estimator_accum.BackupAndRestore` is where
# tf.keras is Keras 3 (under TF_USE_LEGACY_KERAS=1 that name is Keras 2's).
from estimator_accum.keras.backup_keras3 import (  # noqa: I001
  BackupAndRestore,
)

pytestmark = pytest.mark.keras3

K, B = 4, 8
# 5 micro-batches an epoch: epochs end mid-window.
EPOCH = 5 * B


def _keras():
  import keras  # noqa: PLC0415

  return keras


def _fit(epochs, callbacks=()):
  keras = _keras()
  rng = np.random.default_rng(0)
  x = rng.normal(size=(EPOCH, 5)).astype(np.float32)
  y = rng.normal(size=(EPOCH, 1)).astype(np.float32)
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((5,)),
                            keras.layers.Dense(8, activation="tanh"),
                            keras.layers.Dense(1)])
  model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
      keras.optimizers.Adam(1e-2), K), loss="mse")
  model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0,
            callbacks=list(callbacks))
  return model


def _backed_up(backup_dir):
  """A run stopped at the end of epoch 3: its backups of epochs 2 and 3."""
  keras = _keras()

  class Stop(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
      if epoch == 2:
        raise RuntimeError("stopped")

  with pytest.raises(RuntimeError, match="stopped"):
    _fit(5, [BackupAndRestore(backup_dir), Stop()])
  latest = os.path.join(backup_dir, "latest.weights.h5")
  assert os.path.exists(latest) and os.path.exists(latest + ".bkp")
  return latest


def _cut_to_half(path):
  os.truncate(path, os.path.getsize(path) // 2)


def test_a_backup_cut_short_is_skipped_and_fit_goes_on_exactly(tmp_path,
                                                               caplog):
  backup_dir = str(tmp_path / "backup")
  latest = _backed_up(backup_dir)
  _cut_to_half(latest)
  with caplog.at_level("WARNING"):
    resumed = _fit(5, [BackupAndRestore(backup_dir)])
  skipped = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("skipping checkpoint")]
  assert len(skipped) == 1 and skipped[0].startswith(
      f"skipping checkpoint {latest}: "), skipped
  assert skipped[0].endswith(f"; resuming from {latest}.bkp"), skipped
  # Resumed after epoch 2 (the backup before), not started anew.
  assert resumed.history.epoch == [2, 3, 4], resumed.history.epoch
  whole = _fit(5)
  for actual, expected in zip(resumed.get_weights(), whole.get_weights()):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_no_complete_backup_is_one_line(tmp_path):
  backup_dir = str(tmp_path / "backup")
  latest = _backed_up(backup_dir)
  for path in (latest, latest + ".bkp"):
    _cut_to_half(path)
  with pytest.raises(integrity.NoCompleteCheckpoint) as raised:
    _fit(5, [BackupAndRestore(backup_dir)])
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(f"no backup in {backup_dir} is complete "
                            f"({latest}: "), message
  assert f"; {latest}.bkp: " in message and message.endswith(
      "restore a copy, or remove them to start anew."), message
