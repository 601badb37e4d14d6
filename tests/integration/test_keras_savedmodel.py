"""A Keras model compiled with AccumulatingKerasOptimizer, in TensorFlow's
SavedModel format: with include_optimizer=False it loads anywhere, in a
process that never imports estimator_accum, and serves what the trained
model predicts, with no trace of the window; with its optimizer it loads,
serves and trains on from the middle of a window exactly, in a fresh
process, for both optimizer kinds (Keras's own optimizers start afresh
from a SavedModel: load_model compiles the model with a new one). Before,
the new kind's load failed ("'RestoredOptimizer' object has no attribute
'add_slot'"), then training on was refused; a SavedModel of that version
is still refused in one line. A legacy kind's .h5 file resumes exactly in
TensorFlow 2 too (its state was set inside the train step's tf.function,
again at every step: 0.25 away)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

pytestmark = pytest.mark.slow

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"

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


@pytest.mark.keras2
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
model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1, shuffle=False,
          verbose=0)
result["weights"] = [w.tolist() for w in model.get_weights()]
result["micro_batches"] = int(model.optimizer.iterations.numpy())
print("RESULT " + json.dumps(result))
"""


def _continued(model, x):
  model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1,
            shuffle=False, verbose=0)
  return model.get_weights()


@pytest.mark.keras2
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_with_its_optimizer_it_loads_serves_and_trains_on_exactly(
    kind, tmp_path):
  # Saved in the middle of the second window (6 micro-batches of k=4).
  model, x = _trained(kind)
  model.save(str(tmp_path / "model"), save_format="tf")
  loaded = _in_a_fresh_process(_RESUME, tmp_path, x)
  assert "AccumulatingKerasOptimizer" in loaded["optimizer"]
  np.testing.assert_allclose(loaded["predictions"], model.predict(
      x, verbose=0), rtol=0, atol=1e-6)
  assert loaded["micro_batches"] == 12
  for got, expected in zip(loaded["weights"], _continued(model, x)):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.keras2
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_savedmodel_of_an_older_version_is_refused_in_one_line(kind):
  # Written at commit 78c15dd (tests/fixtures/keras_savedmodel_78c15dd):
  # it holds no window; it loads and serves, and training on is refused.
  model = tf.keras.models.load_model(
      str(FIXTURES / "keras_savedmodel_78c15dd" / kind))
  x = np.random.RandomState(0).randn(8, 4).astype("float32")
  assert model.predict(x, verbose=0).shape == (8, 1)
  with pytest.raises(ValueError, match="was loaded from a SavedModel, which "
                     "does not hold its window") as refused:
    model.fit(x, x.sum(1, keepdims=True), batch_size=4, verbose=0)
  assert ".keras" in str(refused.value)


@pytest.mark.keras2
def test_an_h5_file_resumes_the_legacy_kind_exactly(tmp_path):
  model, x = _trained("legacy")
  model.save(str(tmp_path / "model.h5"))
  loaded = tf.keras.models.load_model(str(tmp_path / "model.h5"))
  for got, expected in zip(_continued(loaded, x), _continued(model, x)):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
