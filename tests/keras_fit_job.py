"""Keras `model.fit` in graph mode (`tf.compat.v1.disable_v2_behavior()`,
which holds for the whole process, hence a script of its own): the plain
optimizer at batch k*B, then AccumulatingKerasOptimizer at B, from the same
initial weights on the same examples in the same order.

`python tests/keras_fit_job.py --optimizer adam|sgd --output F.npz`
writes big__<i> and accumulated__<i> for each of the model's weights, and
the wrapper's count of updates; then one more micro-batch (a window left
open), saved with `model.save_weights` (an object-based checkpoint),
cleared and loaded back: restored__micro_batches and restored__accum are
what the load gave back, saved__... what was saved.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import estimator_accum as ea  # noqa: E402
from tests import canned_job  # noqa: E402

K, MICRO_BATCH, EXAMPLES, EPOCHS = 3, 8, 48, 2


def _fit(optimizer, batch, initial):
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
      tf.keras.layers.Dense(1)])
  model.compile(optimizer=optimizer, loss="mse")
  if initial is not None:
    model.set_weights(initial)
  start = model.get_weights()
  model.fit(canned_job.X[:EXAMPLES], canned_job.Y[:EXAMPLES],
            batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0)
  return start, model.get_weights(), model


def _save_and_load_open_window(model, wrapper, state, session, prefix):
  """One more micro-batch, then save_weights; clear the micro-batch count
  and the accumulators, load_weights, read them back."""
  model.fit(canned_job.X[:MICRO_BATCH], canned_job.Y[:MICRO_BATCH],
            batch_size=MICRO_BATCH, epochs=1, shuffle=False, verbose=0)
  window = [wrapper.iterations, state.accumulators[0].total]
  saved = session.run(window)
  model.save_weights(prefix)
  session.run([v.assign(tf.zeros_like(v)) for v in window])
  model.load_weights(prefix)
  restored = session.run(window)
  return {"saved__micro_batches": saved[0], "saved__accum": saved[1],
          "restored__micro_batches": restored[0],
          "restored__accum": restored[1]}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--optimizer", choices=["adam", "sgd"], required=True)
  parser.add_argument("--output", required=True)
  args = parser.parse_args()
  make = canned_job.KERAS_OPTIMIZERS[args.optimizer]
  initial, big, _ = _fit(make(), K * MICRO_BATCH, None)
  wrapper = ea.AccumulatingKerasOptimizer(make(), K)
  _, accumulated, model = _fit(wrapper, MICRO_BATCH, initial)
  session = tf.compat.v1.keras.backend.get_session()
  state = ea.get_accumulation_state()
  arrays = {"updates": session.run(state.updates_applied)}
  arrays.update(_save_and_load_open_window(model, wrapper, state, session,
                                           args.output + ".weights"))
  for i, (start, b, a) in enumerate(zip(initial, big, accumulated)):
    arrays.update({f"initial__{i}": start, f"big__{i}": b,
                   f"accumulated__{i}": a})
  np.savez(args.output, **arrays)


if __name__ == "__main__":
  main()
