"""`BackupAndRestore` for a model trained with the Keras 2
`AccumulatingKerasOptimizer` (TensorFlow 2.15's tf.keras, tf-keras on
2.16+): Keras's callback, whose backup is checked before Keras restores it,
and kept twice.

Keras's BackupAndRestore keeps one backup (`backup_dir/chief/ckpt-N`) and
restores whatever it holds: a backup cut short (a full disk, a copy, a
killed process) or with a flipped bit fails deep inside TensorFlow
(`IndexError: Read less bytes than requested`). This one keeps the last
two, and checks the newest before Keras restores it
(`checkpoints.integrity.resume_from_complete`): a bad one is skipped with
one warning naming the file and what is wrong, and training resumes from
the one before it, at the epoch that one was written; none complete raises
`NoCompleteCheckpoint`, one line naming each, never a silent start from
scratch. (Under Keras 3 the callback is `backup_keras3.py`'s.)
"""

import os

import tensorflow as tf
from absl import logging

from estimator_accum import keras_private
from estimator_accum.checkpoints import integrity

__all__ = ["BackupAndRestore"]

# Backups kept: the newest, and the one to resume from when it is bad.
KEPT = 2


class BackupAndRestore(tf.keras.callbacks.BackupAndRestore):
  """`tf.keras.callbacks.BackupAndRestore` (Keras 2), its backup checked
  before it is restored and the one before it kept (see the module). The
  same arguments.

  Raises:
    NoCompleteCheckpoint (from `fit`): the backup directory holds backups
      and none is complete.
  """

  def on_train_begin(self, logs=None):
    # What every task restores: the chief's backups.
    integrity.resume_from_complete(
        os.path.join(self.backup_dir, "chief"), report=logging.warning)
    super().on_train_begin(logs)
    keras_private.keep_keras2_backups(self._training_state, KEPT)
