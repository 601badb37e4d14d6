"""The library's one door to Keras's private API, one function each (as
`tf_private.py` is TensorFlow's).

Written for Keras 2.15 (TensorFlow 2.15's `tf.keras`), tf-keras 2.16-2.21
and Keras 3.0-3.15 (`releases.py` says which runs). Each function names the
private attribute, call or module it uses and why no public API serves;
`tests/unit/test_tf_private.py` runs each against the installed Keras.
"""

import importlib
import sys

from estimator_accum import releases


def keras3_clip_gradients(optimizer, grads):
  """`grads` clipped as the Keras 3 `optimizer` clips its own (its
  clipnorm, global_clipnorm or clipvalue): `BaseOptimizer._clip_gradients`
  (Keras 3.0-3.15), which has no public name; the window clips its summed
  gradient with it where Keras would clip each replica's share."""
  return optimizer._clip_gradients(grads)  # noqa: SLF001


def keras_loss_has_been_scaled(optimizer):
  """Whether a Keras LossScaleOptimizer's `get_scaled_loss` was called
  (`_loss_has_been_scaled`, its own private flag)."""
  return bool(getattr(optimizer, "_loss_has_been_scaled", False))


def is_wrapped_by_keras_loss_scale_optimizer(optimizer):
  """Whether a Keras LossScaleOptimizer wraps `optimizer`: the private flag
  `_is_wrapped_by_loss_scale_optimizer` it sets on the optimizer it wraps."""
  return bool(getattr(optimizer, "_is_wrapped_by_loss_scale_optimizer", False))


def _keras2_saved_model_module(name):
  """Keras 2's `<package>.src.saving.legacy.saved_model.<name>` module:
  `keras` on TensorFlow 2.15, `tf_keras` where tf-keras serves `tf.keras`
  (2.16+ with TF_USE_LEGACY_KERAS=1); None under Keras 3, which loads no
  Keras-2 SavedModel."""
  package = releases.keras2_module_prefix()
  if package is None:
    return None
  return importlib.import_module(
      f"{package}.src.saving.legacy.saved_model.{name}")


def in_keras_load():
  """Whether Keras 2's `load_model` (of a SavedModel or an .h5 file) is
  running, which no public API reports: Keras 2.15 enters its own
  `keras.src.saving.legacy.saved_model.load_context`, tf-keras (2.16-2.21)
  TensorFlow's `tensorflow.python.distribute.load_context`. A wrapper it
  makes from its config carries no window. False under Keras 3."""
  package = releases.keras2_module_prefix()
  if package is None:
    return False
  if package == "keras":
    load_context = _keras2_saved_model_module("load_context")
  else:
    from tensorflow.python.distribute import (  # noqa: PLC0415
      load_context,
    )
  return bool(load_context.in_load_context())


def keras_saved_model_being_loaded():
  """The path of the SavedModel Keras 2's `load_model` is loading, or None
  (also while it loads an .h5 file, and under Keras 3): the argument `path`
  of `keras.src.saving.legacy.saved_model.load.load` (Keras 2.15; the same
  under `tf_keras.src` in tf-keras 2.16-2.21), found up the call stack. Keras compiles the loaded
  model with an optimizer made anew from its config and tells it nothing of
  the file, whose state it would take back."""
  load = _keras2_saved_model_module("load")
  if load is None:
    return None
  frame = sys._getframe(1)  # noqa: SLF001
  while frame is not None:
    if frame.f_code is load.load.__code__:
      return str(frame.f_locals["path"])
    frame = frame.f_back
  return None


def keras_backup_resumes_at_an_epoch(position):
  """Whether the checkpoint a CheckpointPosition restores from is read by
  a Keras BackupAndRestore that backs up at epochs' ends and resumes at
  the next epoch's start, whatever batch its backup recorded: the
  restore's root (`_checkpoint.graph_view.root`) is the callback's
  `tf.train.Checkpoint(model=...)`, whose model holds the callback's
  training state (`model._training_state`, with `_save_freq` and
  `_enable_save_before_preemption`) while it restores. Its batch hooks
  record each batch even then, when another callback has batch hooks (a
  progress bar), which Keras ignores for such a backup. False when that
  cannot be told."""
  graph_view = getattr(position._checkpoint, "graph_view", None)  # noqa: SLF001
  root = getattr(graph_view, "root", None)
  state = getattr(getattr(root, "model", None), "_training_state", None)
  return (getattr(state, "_save_freq", None) == "epoch"
          and not getattr(state, "_enable_save_before_preemption", True))


def keep_keras2_backups(training_state, count):
  """Keeps the last `count` backups of a Keras 2 BackupAndRestore: its
  `WorkerTrainingState`'s `write_checkpoint_manager._max_to_keep` (Keras
  2.15 and tf-keras 2.16-2.21 keep one, `MAX_CHECKPOINT_TO_KEEP`, and take
  no argument for it)."""
  training_state.write_checkpoint_manager._max_to_keep = count  # noqa: SLF001
