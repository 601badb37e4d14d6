"""`WindowBatchNormalization` under Keras 3 (TensorFlow 2.16+) with the
Keras 3 `AccumulatingKerasOptimizer`, against Keras 2's ghost batch
normalization (tf-keras's `BatchNormalization(virtual_batch_size=B)` at
k x B, which Keras 3 does not have): the weights and the moving
statistics, on one device and under MirroredStrategy, saved mid-window and
loaded, and its refusals."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.keras.batch_norm_keras3 import (
  WindowBatchNormalization,
)

# The layer above is Keras 3's, which `estimator_accum.WindowBatchNormalization`
# is where tf.keras is Keras 3 (under TF_USE_LEGACY_KERAS=1 that name is
# Keras 2's, and the keras package still Keras 3).

pytestmark = pytest.mark.keras3

K, B = 4, 8


def _keras():
  import keras  # noqa: PLC0415

  return keras


def _tf_keras():
  import tf_keras  # noqa: PLC0415

  return tf_keras


def _mirrored():
  from harness.keras_exactness import mirrored_strategy  # noqa: PLC0415

  return mirrored_strategy()


def _data(replicas, windows=3):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(windows * replicas * K * B, 5)) * 3 + 1).astype(
      np.float32)
  return x, rng.normal(size=(len(x), 1)).astype(np.float32)


def _ours(strategy, make_optimizer, momentum=0.5):
  keras = _keras()
  with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(8, use_bias=False),
        WindowBatchNormalization(k=K, momentum=momentum),
        keras.layers.Activation("tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
        make_optimizer(keras.optimizers), K), loss="mse")
  return model


def _interleaved(values, replicas):
  """Keras 2's virtual batch j of a batch holds its examples j, j + k,
  j + 2k, ...: the big batches interleave each replica's micro-batches so
  that its virtual batches are them."""
  out, size = [], replicas * B
  for start in range(0, len(values), K * size):
    window = values[start:start + K * size]
    for replica in range(replicas):
      micro = [window[m * size + replica * B:m * size + (replica + 1) * B]
               for m in range(K)]
      out.append(np.stack(micro, axis=1).reshape((K * B,) + values.shape[1:]))
  return np.concatenate(out)


def _ghost_big_batch(strategy, initial, make_optimizer, x, y, momentum=0.5):
  """tf-keras's ghost batch normalization at k x B from the weights
  `initial` (our model's, without the window's sums)."""
  tf_keras = _tf_keras()
  replicas = strategy.num_replicas_in_sync
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.Input((5,)), tf_keras.layers.Dense(8, use_bias=False),
        tf_keras.layers.BatchNormalization(momentum=momentum,
                                           virtual_batch_size=B),
        tf_keras.layers.Activation("tanh"), tf_keras.layers.Dense(1)])
    # (Keras 2's ghost layer keeps its weights in the virtual batches'
    # shape.)
    model.set_weights([np.reshape(w, v.shape)
                       for w, v in zip(initial, model.get_weights())])
    model.compile(optimizer=make_optimizer(tf_keras.optimizers), loss="mse")
  model.fit(_interleaved(x, replicas), _interleaved(y, replicas),
            batch_size=replicas * K * B, shuffle=False, verbose=0)
  return model.get_weights()


def _model_weights(model):
  """The weights and moving statistics, not the window's sums."""
  return [v.numpy() for v in model.weights
          if not v.path.rsplit("/", 1)[-1].startswith("window_")]


def _assert_close(actual, expected, rtol=1e-5):
  scale = max(float(np.max(np.abs(e))) for e in expected)
  for a, e in zip(actual, expected):
    distance = float(np.max(np.abs(a.ravel() - e.ravel()))) / scale
    assert distance <= rtol, distance


OPTIMIZERS = {"sgd": lambda o: o.SGD(0.1), "adam": lambda o: o.Adam(0.05)}


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_equals_keras_2_ghost_batch_normalization(strategy, name):
  """k micro-batches of B train as tf-keras's ghost batch normalization at
  k x B: the weights and the moving mean and variance, moved once per
  window (3 windows); under MirroredStrategy each replica normalizes its
  share, as each replica of Keras's layer normalizes its virtual batches."""
  strategy = (_mirrored() if strategy == "mirrored"
              else tf.distribute.get_strategy())
  replicas = strategy.num_replicas_in_sync
  x, y = _data(replicas)
  model = _ours(strategy, OPTIMIZERS[name])
  initial = _model_weights(model)
  model.fit(x, y, batch_size=replicas * B, shuffle=False, verbose=0)
  expected = _ghost_big_batch(strategy, initial, OPTIMIZERS[name], x, y)
  layer = model.layers[1]
  moving_mean = layer.moving_mean.numpy()
  assert not np.allclose(moving_mean, 0.0)
  if replicas > 1:
    # Every replica's copy moved alike (Keras 3's own layer lets them
    # drift apart).
    copies = [c.numpy() for c in layer.moving_mean.value.values]
    np.testing.assert_array_equal(copies[0], copies[1])
  _assert_close(_model_weights(model), expected)
  assert float(layer.window_sums[2].numpy()) == 0.0


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_moves_once_per_window_and_not_mid_window(run_eagerly):
  """Mid-window the moving statistics have not moved; the sums hold the
  micro-batches so far (in a compiled step, and run eagerly)."""
  keras = _keras()
  x, y = _data(1, windows=1)
  model = _ours(tf.distribute.get_strategy(), OPTIMIZERS["sgd"])
  model.compile(optimizer=model.optimizer, loss="mse", run_eagerly=run_eagerly)
  layer = model.layers[1]
  before = layer.moving_mean.numpy()
  model.fit(x[:3 * B], y[:3 * B], batch_size=B, shuffle=False, verbose=0)
  np.testing.assert_array_equal(layer.moving_mean.numpy(), before)
  assert float(layer.window_sums[2].numpy()) == 3.0
  model.fit(x[3 * B:4 * B], y[3 * B:4 * B], batch_size=B, shuffle=False,
            verbose=0)
  assert not np.allclose(layer.moving_mean.numpy(), before)
  assert float(layer.window_sums[2].numpy()) == 0.0
  assert isinstance(model.optimizer, keras.optimizers.Optimizer)


def test_two_models_run_eagerly_in_one_process_keep_their_windows_apart():
  """Run eagerly there is no step graph to scope the layers by: model B's
  window end moves B's layer only, not model A's, trained half a window
  before it in the same process."""
  x, y = _data(1, windows=1)

  def eager():
    model = _ours(tf.distribute.get_strategy(), OPTIMIZERS["sgd"])
    model.compile(optimizer=model.optimizer, loss="mse", run_eagerly=True)
    return model

  def fit(model, start, stop):
    model.fit(x[start * B:stop * B], y[start * B:stop * B], batch_size=B,
              shuffle=False, verbose=0)

  alone = eager()
  fit(alone, 0, K)
  first, other = eager(), eager()
  fit(first, 0, 2)
  fit(other, 0, K)
  assert float(first.layers[1].window_sums[2].numpy()) == 2.0
  fit(first, 2, K)
  np.testing.assert_allclose(first.layers[1].moving_mean.numpy(),
                             alone.layers[1].moving_mean.numpy(), rtol=1e-6)


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
def test_saved_mid_window_and_loaded_goes_on_exactly(strategy, tmp_path):
  """A .keras file saved after 6 micro-batches holds the layer's window
  sums (each replica's, summed; loaded split): loaded, it trains on to the
  uninterrupted run's weights and moving statistics."""
  keras = _keras()
  strategy = (_mirrored() if strategy == "mirrored"
              else tf.distribute.get_strategy())
  replicas = strategy.num_replicas_in_sync
  x, y = _data(replicas)
  whole = _ours(strategy, OPTIMIZERS["adam"])
  whole.fit(x, y, batch_size=replicas * B, shuffle=False, verbose=0)
  first = _ours(strategy, OPTIMIZERS["adam"])
  cut = 6 * replicas * B
  first.fit(x[:cut], y[:cut], batch_size=replicas * B, shuffle=False,
            verbose=0)
  path = str(tmp_path / "mid_window.keras")
  first.save(path)
  with strategy.scope():
    loaded = keras.models.load_model(path)
  layer = loaded.layers[1]
  assert isinstance(layer, WindowBatchNormalization)
  assert float(layer.window_sums[2].numpy()) == 2.0 * replicas
  loaded.fit(x[cut:], y[cut:], batch_size=replicas * B, shuffle=False,
             verbose=0)
  _assert_close(_model_weights(loaded), _model_weights(whole))


def test_mixed_float16_normalizes_in_float32():
  """Under mixed_float16 the layer computes in float32 and hands on
  float16; the window still moves the statistics once, near float32's."""
  keras = _keras()
  x, y = _data(1)
  expected = _ours(tf.distribute.get_strategy(), OPTIMIZERS["sgd"])
  expected.fit(x, y, batch_size=B, shuffle=False, verbose=0)
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    model = _ours(tf.distribute.get_strategy(), OPTIMIZERS["sgd"])
    out = model.layers[1](tf.ones((B, 8), tf.float16), training=False)
    model.fit(x, y, batch_size=B, shuffle=False, verbose=0)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert out.dtype == tf.float16
  assert model.layers[1].moving_mean.dtype == "float32"
  # float16 arithmetic in the Dense layers.
  _assert_close(_model_weights(model), _model_weights(expected), rtol=2e-2)


def test_refusals_name_the_argument_and_the_value():
  with pytest.raises(ValueError, match=r"does not take synchronized=True"):
    WindowBatchNormalization(k=2, synchronized=True)
  with pytest.raises(ValueError, match=r"k must be >= 1"):
    WindowBatchNormalization(k=0)
  keras = _keras()
  model = keras.Sequential([
      keras.Input((5,)), WindowBatchNormalization(k=2),
      keras.layers.Dense(1)])
  model.compile(optimizer=estimator_accum.AccumulatingKerasOptimizer(
      keras.optimizers.SGD(0.1), K), loss="mse")
  x, y = _data(1, windows=1)
  with pytest.raises(ValueError, match=r"made with k=2 and its "
                     r"AccumulatingKerasOptimizer with k=4"):
    model.fit(x, y, batch_size=B, verbose=0)
