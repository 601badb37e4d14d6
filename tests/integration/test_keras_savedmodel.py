"""A Keras model compiled with AccumulatingKerasOptimizer, in TensorFlow's
SavedModel format: with include_optimizer=False it loads anywhere, in a
process that never imports estimator_accum, and serves what the trained
model predicts, with no trace of the window; around a
tf.keras.optimizers.Optimizer, with its optimizer the save is refused in one
line (TensorFlow's loader cannot bring the window back: load_model failed
with "'RestoredOptimizer' object has no attribute 'add_slot'"), pointing to
the .keras file and checkpoints, which resume exactly. (The legacy kind
saves and loads with its config, tests/integration/test_keras_models.py.)"""

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
  np.save(tmp_path / "x.npy", x)
  done = subprocess.run(
      [sys.executable, "-c", _LOAD, str(tmp_path / "model"),
       str(tmp_path / "x.npy")], capture_output=True, text=True,
      timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  loaded = json.loads(next(li for li in done.stdout.splitlines()
                           if li.startswith("RESULT "))[len("RESULT "):])
  assert not loaded["estimator_accum"]
  assert loaded["optimizer"] == "None"
  assert not [v for v in loaded["variables"] if "accum" in v or
              "gradient_accumulation" in v or "micro_batches" in v]
  np.testing.assert_allclose(loaded["predictions"], model.predict(
      x, verbose=0), rtol=0, atol=1e-6)


def test_with_the_new_kinds_optimizer_the_save_is_refused_in_one_line(
    tmp_path):
  model, _ = _trained("new")
  with pytest.raises(ValueError) as raised:
    model.save(str(tmp_path / "model"), save_format="tf")
  message = str(raised.value)
  assert "cannot be saved in the SavedModel format with its optimizer" in (
      message)
  assert ".keras" in message and "include_optimizer=False" in message
  assert "\n" not in message
