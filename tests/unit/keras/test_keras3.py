"""AccumulatingKerasOptimizer around a Keras 3 optimizer (TensorFlow 2.16+),
against Keras 3's own big batch: `model.fit` and a custom loop, every
Keras 3 optimizer, an uneven last micro-batch, clipping, a learning-rate
schedule, a mid-window save and load, and its refusals."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

pytestmark = pytest.mark.keras3

K, MICRO_BATCH = 4, 8
# 60 examples: big batches of 32 and 28; the second window's last
# micro-batch holds 4 examples.
EXAMPLES = 60


def _keras():
  import keras  # noqa: PLC0415

  return keras


def _data(examples=EXAMPLES):
  rng = np.random.default_rng(0)
  return (rng.normal(size=(examples, 5)).astype("float32"),
          rng.normal(size=(examples, 1)).astype("float32"))


def _model():
  keras = _keras()
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((5,)),
                           keras.layers.Dense(8, activation="tanh"),
                           keras.layers.Dense(1)])


def _fit_under(strategy, make_optimizer, batch, epochs=1,
               examples=EXAMPLES, **fit):
  """The model compiled in `strategy`'s scope with `make_optimizer()` (a
  Keras 3 optimizer takes the strategy it is made in), fitted."""
  x, y = _data(examples)
  with strategy.scope():
    model = _model()
    model.compile(optimizer=make_optimizer(), loss="mse")
  model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
            **fit)
  return model


def _fit(optimizer, batch, epochs=1, examples=EXAMPLES, **fit):
  return _fit_under(tf.distribute.get_strategy(), lambda: optimizer, batch,
                    epochs, examples, **fit)


def _train_in_a_loop(model, apply, x, y, batch):
  """`model` trained by a custom loop in batches of `batch`, each step's
  gradients handed to `apply(gradients, variables)`."""
  loss_fn = _keras().losses.MeanSquaredError()

  @tf.function
  def step(features, labels):
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(features, training=True))
    apply(tape.gradient(loss, model.trainable_variables),
          model.trainable_variables)

  for features, labels in tf.data.Dataset.from_tensor_slices((x, y)).batch(
      batch):
    step(features, labels)
  return model


def _assert_close(actual, expected, rtol=1e-5):
  for a, e in zip(actual.get_weights(), expected.get_weights()):
    scale = max(float(np.max(np.abs(e))), 1e-6)
    distance = float(np.max(np.abs(a - e))) / scale
    assert distance <= rtol, distance


def _accumulating(optimizer, **options):
  return estimator_accum.AccumulatingKerasOptimizer(optimizer, K, **options)


OPTIMIZERS = {
    "sgd": lambda o: o.SGD(0.1),
    "momentum": lambda o: o.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda o: o.Adam(1e-2),
    "amsgrad": lambda o: o.Adam(1e-2, amsgrad=True),
    "adamw": lambda o: o.AdamW(1e-2, weight_decay=0.1),
    "rmsprop": lambda o: o.RMSprop(1e-2, momentum=0.5, centered=True),
    "adagrad": lambda o: o.Adagrad(0.1),
    "adadelta": lambda o: o.Adadelta(1.0),
    "adamax": lambda o: o.Adamax(1e-2),
    "nadam": lambda o: o.Nadam(1e-2),
    "ftrl": lambda o: o.Ftrl(0.1, l1_regularization_strength=1e-3),
    "lion": lambda o: o.Lion(1e-3),
    "adafactor": lambda o: o.Adafactor(1e-2),
    "lamb": lambda o: o.Lamb(1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_equals_the_big_batch_for_every_optimizer(name):
  optimizers = _keras().optimizers
  made = OPTIMIZERS[name]
  expected = _fit(made(optimizers), K * MICRO_BATCH, epochs=2,
                  examples=4 * K * MICRO_BATCH)
  actual = _fit(_accumulating(made(optimizers)), MICRO_BATCH, epochs=2,
                examples=4 * K * MICRO_BATCH)
  _assert_close(actual, expected)
  # `iterations` counts micro-batches; the inner optimizer's, updates.
  assert int(actual.optimizer.iterations) == 2 * 4 * K
  assert int(actual.optimizer.inner_optimizer.iterations) == 2 * 4


def test_an_uneven_last_micro_batch_weighs_its_examples():
  """Keras 3's own gradient_accumulation_steps is off by ~6e-2 here."""
  optimizers = _keras().optimizers
  expected = _fit(optimizers.Adam(1e-2), K * MICRO_BATCH)
  actual = _fit(_accumulating(optimizers.Adam(1e-2)), MICRO_BATCH)
  _assert_close(actual, expected)
  own = _fit(optimizers.Adam(1e-2, gradient_accumulation_steps=K),
             MICRO_BATCH)
  with pytest.raises(AssertionError):
    _assert_close(own, expected, rtol=1e-3)


def test_sum_reduction_adds_the_micro_batches():
  keras = _keras()
  x, y = _data(K * MICRO_BATCH * 2)
  expected, actual = _model(), _model()
  expected.compile(optimizer=keras.optimizers.SGD(1e-3),
                   loss=keras.losses.MeanSquaredError(reduction="sum"))
  expected.fit(x, y, batch_size=K * MICRO_BATCH, shuffle=False, verbose=0)
  actual.compile(optimizer=_accumulating(keras.optimizers.SGD(1e-3),
                                         reduction="sum"),
                 loss=keras.losses.MeanSquaredError(reduction="sum"))
  actual.fit(x, y, batch_size=MICRO_BATCH, shuffle=False, verbose=0)
  _assert_close(actual, expected)


def test_clip_norm_clips_the_window_as_global_clipnorm_clips_a_batch():
  optimizers = _keras().optimizers
  expected = _fit(optimizers.SGD(0.1, global_clipnorm=0.05), K * MICRO_BATCH)
  actual = _fit(_accumulating(optimizers.SGD(0.1), clip_norm=0.05),
                MICRO_BATCH)
  _assert_close(actual, expected)
  unclipped = _fit(optimizers.SGD(0.1), K * MICRO_BATCH)
  with pytest.raises(AssertionError):
    _assert_close(unclipped, expected, rtol=1e-3)


def test_a_schedule_steps_once_per_window():
  keras = _keras()

  def schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.5)

  expected = _fit(keras.optimizers.SGD(schedule()), K * MICRO_BATCH,
                  epochs=3)
  actual = _fit(_accumulating(keras.optimizers.SGD(schedule())), MICRO_BATCH,
                epochs=3)
  _assert_close(actual, expected)


def test_a_custom_loop_and_a_short_last_batch():
  keras = _keras()
  x, y = _data()
  expected = _fit(keras.optimizers.Adam(1e-2), K * MICRO_BATCH)
  optimizer = _accumulating(keras.optimizers.Adam(1e-2))
  model = _train_in_a_loop(
      _model(), lambda grads, variables: optimizer.apply_gradients(
          zip(grads, variables)), x, y, MICRO_BATCH)
  _assert_close(model, expected)


def test_saved_mid_window_and_loaded_goes_on_exactly(tmp_path):
  """A .keras file saved after 6 micro-batches (mid-window) and loaded into
  a new model trains on to the uninterrupted run's weights."""
  keras = _keras()
  x, y = _data(K * MICRO_BATCH * 3)
  whole = _model()
  whole.compile(optimizer=_accumulating(keras.optimizers.Adam(1e-2)),
                loss="mse")
  whole.fit(x, y, batch_size=MICRO_BATCH, shuffle=False, verbose=0)
  first = _model()
  first.compile(optimizer=_accumulating(keras.optimizers.Adam(1e-2)),
                loss="mse")
  cut = 6 * MICRO_BATCH
  first.fit(x[:cut], y[:cut], batch_size=MICRO_BATCH, shuffle=False,
            verbose=0)
  path = str(tmp_path / "mid_window.keras")
  first.save(path)
  loaded = keras.models.load_model(path)
  assert int(loaded.optimizer.iterations) == 6
  assert float(loaded.optimizer.window_examples) == 2 * MICRO_BATCH
  loaded.fit(x[cut:], y[cut:], batch_size=MICRO_BATCH, shuffle=False,
             verbose=0)
  _assert_close(loaded, whole)


def test_mixed_float16_stays_near_the_big_batch():
  """compile wraps it in Keras 3's LossScaleOptimizer, which calls it in a
  cond: the short last micro-batch is still weighed by its examples."""
  keras = _keras()
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    expected = _fit(keras.optimizers.Adam(1e-2), K * MICRO_BATCH)
    actual = _fit(_accumulating(keras.optimizers.Adam(1e-2)), MICRO_BATCH)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert isinstance(actual.optimizer, keras.optimizers.LossScaleOptimizer)
  # float16 arithmetic: 1.7e-4 from the big batch with even batches.
  _assert_close(actual, expected, rtol=1e-3)


def test_a_loss_factor_of_the_inner_optimizer_scales_and_unscales():
  optimizers = _keras().optimizers
  expected = _fit(optimizers.SGD(0.1), K * MICRO_BATCH)
  actual = _fit(_accumulating(optimizers.SGD(0.1, loss_scale_factor=128.0)),
                MICRO_BATCH)
  _assert_close(actual, expected)


def test_refusals_name_the_argument_and_the_value():
  keras = _keras()
  with pytest.raises(ValueError, match=r"k must be >= 1 \(micro-batches per "
                     r"update\), got 0\."):
    estimator_accum.AccumulatingKerasOptimizer(keras.optimizers.Adam(), 0)
  with pytest.raises(TypeError, match=r"got accumulator_placement='host'"):
    _accumulating(keras.optimizers.Adam(), accumulator_placement="host")
  with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2"):
    _accumulating(keras.optimizers.Adam(gradient_accumulation_steps=2))
  with pytest.raises(ValueError, match=r"reduction=.?median"):
    _accumulating(keras.optimizers.Adam(), reduction="median")
  with pytest.raises(TypeError, match=r"LossScaleOptimizer\(Accumulating"):
    _accumulating(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
  with pytest.raises(ValueError, match=r"clip_norm must be a finite number > "
                     r"0 or None, got -1\."):
    _accumulating(keras.optimizers.Adam(), clip_norm=-1)


def _mirrored():
  from harness.keras_exactness import mirrored_strategy  # noqa: PLC0415

  return mirrored_strategy()


MIRRORED = ("sgd", "momentum", "adam", "adamw", "rmsprop", "lamb")


@pytest.mark.parametrize("name", MIRRORED)
def test_mirrored_equals_the_big_batch(name):
  """Each replica accumulates its own share: the window is Keras 3's big
  batch under the same strategy, and the big batch on one device; an
  uneven last micro-batch (60 examples) included."""
  optimizers = _keras().optimizers
  made = OPTIMIZERS[name]
  mirrored = _mirrored()
  expected = _fit_under(mirrored, lambda: made(optimizers), K * MICRO_BATCH,
                        epochs=2)
  actual = _fit_under(mirrored, lambda: _accumulating(made(optimizers)),
                      MICRO_BATCH, epochs=2)
  _assert_close(actual, expected)
  assert int(actual.optimizer.inner_optimizer.iterations.numpy()) == 2 * 2
  one_device = _fit(made(optimizers), K * MICRO_BATCH, epochs=2)
  _assert_close(actual, one_device)


def test_mirrored_clips_the_window_as_one_device_clips_the_big_batch():
  """Keras 3 clips each replica's share before summing them (its big batch
  under MirroredStrategy is then not the one device's); the window is
  clipped whole, by its clip_norm and by the inner optimizer's own."""
  optimizers = _keras().optimizers
  mirrored = _mirrored()
  for inner, options, reference in (
      (lambda: optimizers.Adam(1e-2, global_clipnorm=0.05), {},
       lambda: optimizers.Adam(1e-2, global_clipnorm=0.05)),
      (lambda: optimizers.SGD(0.1, clipnorm=0.02), {},
       lambda: optimizers.SGD(0.1, clipnorm=0.02)),
      (lambda: optimizers.SGD(0.1), {"clip_norm": 0.05},
       lambda: optimizers.SGD(0.1, global_clipnorm=0.05))):
    expected = _fit(reference(), K * MICRO_BATCH)
    actual = _fit_under(mirrored,
                        lambda: _accumulating(inner(), **options),  # noqa: B023
                        MICRO_BATCH)
    _assert_close(actual, expected)
  own = _fit_under(mirrored, lambda: optimizers.Adam(1e-2,
                                                     global_clipnorm=0.05),
                   K * MICRO_BATCH)
  expected = _fit(optimizers.Adam(1e-2, global_clipnorm=0.05),
                  K * MICRO_BATCH)
  with pytest.raises(AssertionError):
    _assert_close(own, expected, rtol=1e-3)


def _embedding_model():
  keras = _keras()
  keras.utils.set_random_seed(0)
  ids = keras.Input((3,), dtype="int32")
  embedded = keras.layers.GlobalAveragePooling1D()(
      keras.layers.Embedding(20, 4)(ids))
  return keras.Model(ids, keras.layers.Dense(1)(embedded))


def test_mirrored_accumulates_sparse_gradients_on_each_replica():
  """An Embedding's gradient (tf.IndexedSlices) is added to the replica's
  own copy of its accumulator, row by row; the window hands the inner
  optimizer the window's gradient, dense. SGD: Keras's big batch. Adam:
  the big batch given its gradient dense, as Keras 3's optimizers square
  a tf.IndexedSlices slice by slice (the squares of a repeated row's
  slices summed, not the square of their sum: Keras's own big batch is
  then 0.21 away from the dense one here)."""
  keras = _keras()
  rng = np.random.default_rng(1)
  ids = rng.integers(0, 20, size=(EXAMPLES, 3)).astype("int32")
  y = rng.normal(size=(EXAMPLES, 1)).astype("float32")

  def fit(strategy, optimizer, batch):
    with strategy.scope():
      model = _embedding_model()
      model.compile(optimizer=optimizer(), loss="mse")
    model.fit(ids, y, batch_size=batch, shuffle=False, verbose=0)
    return model

  def dense_big_batch(optimizer):
    return _train_in_a_loop(
        _embedding_model(), lambda grads, variables: optimizer.apply(
            [tf.convert_to_tensor(g) for g in grads], variables),
        ids, y, K * MICRO_BATCH)

  optimizers = keras.optimizers
  _assert_close(
      fit(_mirrored(), lambda: _accumulating(optimizers.SGD(0.1)),
          MICRO_BATCH),
      fit(tf.distribute.get_strategy(), lambda: optimizers.SGD(0.1),
          K * MICRO_BATCH))
  _assert_close(
      fit(_mirrored(), lambda: _accumulating(optimizers.Adam(1e-2)),
          MICRO_BATCH),
      dense_big_batch(optimizers.Adam(1e-2)))


def test_mirrored_saved_mid_window_and_loaded_goes_on_exactly(tmp_path):
  """Each replica's sums are saved summed and loaded split: a .keras file
  saved mid-window under MirroredStrategy, loaded into it, trains on to
  the uninterrupted run's weights."""
  keras = _keras()
  mirrored = _mirrored()
  x, y = _data(K * MICRO_BATCH * 3)

  def compiled():
    with mirrored.scope():
      model = _model()
      model.compile(optimizer=_accumulating(keras.optimizers.Adam(1e-2)),
                    loss="mse")
    return model

  whole = compiled()
  whole.fit(x, y, batch_size=MICRO_BATCH, shuffle=False, verbose=0)
  first = compiled()
  cut = 6 * MICRO_BATCH
  first.fit(x[:cut], y[:cut], batch_size=MICRO_BATCH, shuffle=False,
            verbose=0)
  path = str(tmp_path / "mid_window.keras")
  first.save(path)
  with mirrored.scope():
    loaded = keras.models.load_model(path)
  assert float(loaded.optimizer.window_examples.numpy()) == 2 * MICRO_BATCH
  loaded.fit(x[cut:], y[cut:], batch_size=MICRO_BATCH, shuffle=False,
             verbose=0)
  _assert_close(loaded, whole)
