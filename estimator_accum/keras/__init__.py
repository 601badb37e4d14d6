"""The way in for Keras: `AccumulatingKerasOptimizer` around a Keras 2
optimizer (legacy or TensorFlow 2's; optimizer.py, optimizer_legacy.py,
optimizer_v3.py, loss_scale.py) or a Keras 3 one (optimizer_keras3.py,
variables_keras3.py), `WindowBatchNormalization` (batch_norm.py,
batch_norm_keras3.py) and `BackupAndRestore` (backup.py, backup_keras3.py):
each the one of the Keras `tf.keras` is."""

from estimator_accum import releases

# The kinds around a tf.keras.optimizers.Optimizer and a legacy one
# (AccumulatingKerasOptimizer makes one of its subclasses; importing them
# registers them for loading saved models).
from estimator_accum.keras import optimizer_legacy, optimizer_v3  # noqa: F401
from estimator_accum.keras.optimizer import AccumulatingKerasOptimizer

if releases.keras_major() >= 3:
  from estimator_accum.keras.backup_keras3 import BackupAndRestore
  from estimator_accum.keras.batch_norm_keras3 import WindowBatchNormalization
else:
  from estimator_accum.keras.backup import BackupAndRestore
  from estimator_accum.keras.batch_norm import WindowBatchNormalization

__all__ = ["AccumulatingKerasOptimizer", "BackupAndRestore",
           "WindowBatchNormalization"]
