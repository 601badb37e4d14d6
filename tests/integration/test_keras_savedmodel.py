"""A Keras model compiled with AccumulatingKerasOptimizer, in TensorFlow's
SavedModel format: with include_optimizer=False it loads anywhere, in a
process that never imports estimator_accum, and serves what the trained
model predicts, with no trace of the window; with its optimizer it
loads and serves too (the new kind's load failed with "'RestoredOptimizer'
object has no attribute 'add_slot'"), and training on from it is refused in
one line (the legacy kind's used to resume silently without its window and
micro-batch count: 0.074 away from the uninterrupted run), pointing to the
.keras file and checkpoints, which resume exactly."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

pytestmark = pytest.mark.slow

KINDS = {"new": lambda: tf.keras.optimizers.Adam(0.1),
         "legacy": lambda: tf.keras.optimizers.legacy.Adam(0.1)}


def _trained(kind):
  x = np.random.RandomState(0).randn(48, 4).astype("float32")
  model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,)),
                               tf.keras.layers.Dense(1)])
  model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
      KINDS[kind](), k=4), loss="mse")
  # 6 micro-batches: the second window is open when the model is saved.
  model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1,
            shuffle=False, verbose=0)
  return model, x


def _in_a_fresh_process(script, tmp_path, x):
  """What `script` prints after "RESULT ", run on tmp_path/model and `x`."""
  np.save(tmp_path / "x.npy", x)
  done = subprocess.run(
      [sys.executable, "-c", script, str(tmp_path / "model"),
       str(tmp_path / "x.npy")], capture_output=True, text=True,
      timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(next(li for li in done.stdout.splitlines()
                         if li.startswith("RESULT "))[len("RESULT "):])


_LOAD = """
import json, sys
import numpy as np, tensorflow as tf
model = tf.keras.models.load_model(sys.argv[1])
x = np.load(sys.argv[2])
print("RESULT " + json.dumps({
    "predictions": model.predict(x, verbose=0).tolist(),
    "optimizer": repr(model.optimizer),
    "variables": [v.name for v in model.variables],
    "estimator_accum": "estimator_accum" in sys.modules}))
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_without_the_optimizer_it_loads_anywhere_and_serves(kind, tmp_path):
  model, x = _trained(kind)
  model.save(str(tmp_path / "model"), save_format="tf",
             include_optimizer=False)
  loaded = _in_a_fresh_process(_LOAD, tmp_path, x)
  assert not loaded["estimator_accum"]
  assert loaded["optimizer"] == "None"
  assert not [v for v in loaded["variables"] if "accum" in v or
              "gradient_accumulation" in v or "micro_batches" in v]
  np.testing.assert_allclose(loaded["predictions"], model.predict(
      x, verbose=0), rtol=0, atol=1e-6)


_RESUME = """
import json, sys
import numpy as np, tensorflow as tf
import estimator_accum  # the optimizer's registered class
model = tf.keras.models.load_model(sys.argv[1])
x = np.load(sys.argv[2])
result = {"predictions": model.predict(x, verbose=0).tolist(),
          "optimizer": type(model.optimizer).__name__}
try:
  model.fit(x, x.sum(1, keepdims=True), batch_size=8, verbose=0)
  result["refused"] = None
except ValueError as error:
  result["refused"] = str(error)
print("RESULT " + json.dumps(result))
"""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_with_its_optimizer_it_loads_and_serves_and_refuses_to_train_on(
    kind, tmp_path):
  # The SavedModel holds no window (nor, for the new kind, can TensorFlow's
  # loader take one back): resumed training would not be the big batch's.
  model, x = _trained(kind)
  model.save(str(tmp_path / "model"), save_format="tf")
  loaded = _in_a_fresh_process(_RESUME, tmp_path, x)
  assert "AccumulatingKerasOptimizer" in loaded["optimizer"]
  np.testing.assert_allclose(loaded["predictions"], model.predict(
      x, verbose=0), rtol=0, atol=1e-6)
  refused = loaded["refused"]
  assert refused and "was loaded from a SavedModel, which does not hold " \
      "its window" in refused and ".keras" in refused, refused
  # The model saved still trains (the save changed nothing of its window).
  model.fit(x[:8], x[:8].sum(1, keepdims=True), batch_size=8, verbose=0)
