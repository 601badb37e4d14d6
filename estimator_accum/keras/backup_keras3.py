"""`BackupAndRestore` under Keras 3 (TensorFlow 2.16+'s default
`tf.keras`): Keras 3's callback keeping the backup before the newest
(`double_checkpoint=True`, the default here) and checking the newest before
Keras restores it.

Keras 3's callback, given `double_checkpoint=True`, restores the backup
before a newest one it cannot open, and says nothing; without it, it
fails. Here a backup cut short (a full disk, a copy, a killed process) is
named in one warning and `fit` resumes from the one before, at its epoch;
none complete raises `NoCompleteCheckpoint`, one line naming each, never a
silent start from scratch.
"""

import inspect
import os

import h5py
import keras
from absl import logging

from estimator_accum.checkpoints.integrity import NoCompleteCheckpoint

__all__ = ["BackupAndRestore"]

# Keras 3's names for its backup (`backup_and_restore.py`, 3.0-3.15).
_LATEST = "latest.weights.h5"
_PREVIOUS = _LATEST + ".bkp"


def _problem(path):
  """What is wrong with the backup `path` (an HDF5 file), in a phrase; None
  when it opens and every dataset in it reads whole, or it is absent."""
  if not os.path.exists(path):
    return None
  try:
    with h5py.File(path, "r") as file:
      file.visititems(lambda _, item: item[()] if isinstance(
          item, h5py.Dataset) else None)
  except (OSError, ValueError, KeyError, RuntimeError) as error:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
  return None


class BackupAndRestore(keras.callbacks.BackupAndRestore):
  """`keras.callbacks.BackupAndRestore` (Keras 3), the backup before the
  newest kept and the newest checked before it is restored (see the
  module). The same arguments; `double_checkpoint` defaults to True.

  Raises:
    NoCompleteCheckpoint (from `fit`): the backup directory holds backups
      and none is complete.
  """

  def __init__(self, backup_dir, **kwargs):
    if "double_checkpoint" in inspect.signature(
        keras.callbacks.BackupAndRestore).parameters:
      kwargs.setdefault("double_checkpoint", True)
    super().__init__(backup_dir, **kwargs)

  def on_train_begin(self, logs=None):
    latest = os.path.join(self.backup_dir, _LATEST)
    wrong = _problem(latest)
    if wrong is not None:
      previous = os.path.join(self.backup_dir, _PREVIOUS)
      before = (_problem(previous) if os.path.exists(previous)
                else "it is missing")
      if before is not None or not getattr(self, "double_checkpoint", False):
        raise NoCompleteCheckpoint(
            f"no backup in {self.backup_dir} is complete ({latest}: {wrong}; "
            f"{previous}: {before}); restore a copy, or remove them to start "
            f"anew.")
      # Keras restores the one before it, finding this one cannot be read.
      logging.warning("skipping checkpoint %s: %s; resuming from %s", latest,
                      wrong, previous)
    super().on_train_begin(logs)
