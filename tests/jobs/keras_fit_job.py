"""Keras `model.fit` in graph mode (`tf.compat.v1.disable_v2_behavior()`,
which holds for the whole process, hence a script of its own): the plain
optimizer at batch k*B, then AccumulatingKerasOptimizer at B, from the same
initial weights on the same examples in the same order.

`python tests/jobs/keras_fit_job.py --optimizer adam|sgd --output F.npz
[--replicas 2]` (the accumulated model compiled under MirroredStrategy over
2 logical CPUs, each taking B of a batch of 2*B; the big batch 2*k*B on one
device) writes big__<i> and accumulated__<i> for each of the model's weights, and
the wrapper's count of updates; then one more micro-batch (a window left
open), saved with `model.save_weights` (an object-based checkpoint),
cleared and loaded back: restored__micro_batches and restored__accum are
what the load gave back, saved__... what was saved.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

# conftest makes 2 logical CPUs for MirroredStrategy.
import estimator_accum as ea  # noqa: E402
from tests import conftest  # noqa: E402, F401
from tests.jobs import canned_job  # noqa: E402, F401

K, MICRO_BATCH, EXAMPLES, EPOCHS = 3, 8, 48, 2


def _fit(optimizer, batch, initial, strategy=None):
  with (strategy or tf.distribute.get_strategy()).scope():
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


def _save_and_load_open_window(model, wrapper, state, session, prefix,
                               batch):
  """One more micro-batch, then save_weights; clear the micro-batch count
  and the accumulators, load_weights, read them back."""
  model.fit(canned_job.X[:batch], canned_job.Y[:batch], batch_size=batch,
            epochs=1, shuffle=False, verbose=0)
  window = [wrapper.iterations, state.accumulators[0].total]
  saved = session.run(window)
  model.save_weights(prefix)
  # Each replica's copy (a sum over replicas cannot be assigned as such).
  session.run([c.assign(tf.zeros_like(c))
               for v in window for c in getattr(v, "values", [v])])
  model.load_weights(prefix)
  restored = session.run(window)
  return {"saved__micro_batches": saved[0], "saved__accum": saved[1],
          "restored__micro_batches": restored[0],
          "restored__accum": restored[1]}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--optimizer", choices=["adam", "sgd"], required=True)
  parser.add_argument("--output", required=True)
  parser.add_argument("--replicas", type=int, choices=[1, 2], default=1)
  args = parser.parse_args()
  make = canned_job.KERAS_OPTIMIZERS[args.optimizer]
  batch = args.replicas * MICRO_BATCH
  initial, big, _ = _fit(make(), K * batch, None)
  wrapper = ea.AccumulatingKerasOptimizer(make(), K)
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
              if args.replicas > 1 else None)
  _, accumulated, model = _fit(wrapper, batch, initial, strategy)
  session = tf.compat.v1.keras.backend.get_session()
  state = ea.get_accumulation_state()
  arrays = {"updates": session.run(state.updates_applied)}
  arrays.update(_save_and_load_open_window(
      model, wrapper, state, session, args.output + ".weights", batch))
  for i, (start, b, a) in enumerate(zip(initial, big, accumulated)):
    arrays.update({f"initial__{i}": start, f"big__{i}": b,
                   f"accumulated__{i}": a})
  np.savez(args.output, **arrays)


if __name__ == "__main__":
  main()
