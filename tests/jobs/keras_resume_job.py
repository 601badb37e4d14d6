"""Keras `model.fit` in graph mode resumed in a new process from
`save_weights` taken in the middle of a window.

  python tests/jobs/keras_resume_job.py save DIR   # 4 micro-batches (k=3), save
  python tests/jobs/keras_resume_job.py resume DIR OUT [--renamed] [--built]
  python tests/jobs/keras_resume_job.py h5 DIR     # save the model, load_model
  python tests/jobs/keras_resume_job.py tf DIR     # the same as a SavedModel

`resume` loads DIR's checkpoint, fits the 2 micro-batches left, then fits
the same 6 micro-batches in one `fit` from DIR/initial.npz, and writes
OUT/resumed.npz and OUT/uninterrupted.npz. `--renamed` builds a model
first, so that the loaded one's layers get other names (`dense_2`...);
`--built` builds the train step (and the window) before loading, not
after. A ValueError loading raises is printed. `h5` saves the whole model
as an .h5 file after 4 micro-batches, loads it with `load_model`, fits the
2 left and writes DIR/resumed.npz, DIR/uninterrupted.npz and
DIR/initial.npz; `tf` does the same with Keras's SavedModel format, loaded
into the graph of the model it was saved from (which keeps its layer names),
and prints the ValueError fitting it raises.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import estimator_accum as ea  # noqa: E402
from tests.jobs import canned_job  # noqa: E402

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
  stage, directory, *rest = sys.argv[1:]
  prefix = os.path.join(directory, "weights")
  if stage == "save":
    model = _model()
    np.savez(os.path.join(directory, "initial.npz"), *model.get_weights())
    _fit(model, 0, SAVED_AFTER)
    model.save_weights(prefix)
    return
  if stage in ("h5", "tf"):
    model = _model()
    initial = model.get_weights()
    np.savez(os.path.join(directory, "initial.npz"), *initial)
    _fit(model, 0, SAVED_AFTER)
    path = os.path.join(directory, "model.h5" if stage == "h5" else "model")
    model.save(path, save_format=stage)
    resumed = tf.keras.models.load_model(path)
    try:
      _fit(resumed, SAVED_AFTER, TOTAL)
    except ValueError as error:
      print("ValueError:", error)
      return
    uninterrupted = _model(initial)
    _fit(uninterrupted, 0, TOTAL)
    np.savez(os.path.join(directory, "resumed.npz"), *resumed.get_weights())
    np.savez(os.path.join(directory, "uninterrupted.npz"),
             *uninterrupted.get_weights())
    return
  output, options = rest[0], rest[1:]
  if "--renamed" in options:
    _model()
  resumed = _model()
  if "--built" in options:
    resumed._make_train_function()
  try:
    resumed.load_weights(prefix)
    _fit(resumed, SAVED_AFTER, TOTAL)
  except ValueError as error:
    print("ValueError:", error)
    return
  saved = np.load(os.path.join(directory, "initial.npz"))
  uninterrupted = _model([saved[f"arr_{i}"] for i in range(4)])
  _fit(uninterrupted, 0, TOTAL)
  np.savez(os.path.join(output, "resumed.npz"), *resumed.get_weights())
  np.savez(os.path.join(output, "uninterrupted.npz"),
           *uninterrupted.get_weights())


if __name__ == "__main__":
  main()
