"""Keras `model.fit` in graph mode resumed in a new process from
`save_weights` taken in the middle of a window, loaded before the first
`fit` (so the window is built after the checkpoint is read).

  python tests/keras_resume_job.py save DIR     # 4 micro-batches (k=3), save
  python tests/keras_resume_job.py resume DIR   # load, 2 more; then 6 anew
  python tests/keras_resume_job.py renamed DIR  # load into other names

`resume` writes DIR/resumed.npz and DIR/uninterrupted.npz (the same 6
micro-batches in one `fit`, from the same initial weights); `renamed` builds
one model first, so the loaded one's layers get other names, and prints the
error loading raises.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import estimator_accum as ea  # noqa: E402
from tests import canned_job  # noqa: E402

K, MICRO_BATCH, SAVED_AFTER, TOTAL = 3, 8, 4, 6


def _model(initial=None):
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
      tf.keras.layers.Dense(1)])
  model.compile(optimizer=ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.legacy.Adam(0.05), K), loss="mse")
  if initial is not None:
    model.set_weights(initial)
  return model


def _fit(model, first, last):
  rows = slice(first * MICRO_BATCH, last * MICRO_BATCH)
  model.fit(canned_job.X[rows], canned_job.Y[rows], batch_size=MICRO_BATCH,
            epochs=1, shuffle=False, verbose=0)


def main():
  stage, directory = sys.argv[1:]
  prefix = os.path.join(directory, "weights")
  if stage == "save":
    model = _model()
    np.savez(os.path.join(directory, "initial.npz"), *model.get_weights())
    _fit(model, 0, SAVED_AFTER)
    model.save_weights(prefix)
  elif stage == "resume":
    resumed = _model()
    resumed.load_weights(prefix)
    _fit(resumed, SAVED_AFTER, TOTAL)
    saved = np.load(os.path.join(directory, "initial.npz"))
    uninterrupted = _model([saved[f"arr_{i}"] for i in range(4)])
    _fit(uninterrupted, 0, TOTAL)
    np.savez(os.path.join(directory, "resumed.npz"), *resumed.get_weights())
    np.savez(os.path.join(directory, "uninterrupted.npz"),
             *uninterrupted.get_weights())
  else:
    _model()
    renamed = _model()
    renamed.load_weights(prefix)
    try:
      _fit(renamed, SAVED_AFTER, TOTAL)
    except ValueError as error:
      print("ValueError:", error)


if __name__ == "__main__":
  main()
