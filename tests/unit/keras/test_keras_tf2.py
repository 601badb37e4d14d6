"""TensorFlow 2 Keras: AccumulatingKerasOptimizer in `model.fit` and in a
custom `train_step`, inside tf.functions, on one device and under
MirroredStrategy over 2 logical CPUs, in float32 and mixed_float16; the
window's state in checkpoints; WindowBatchNormalization against Keras's
ghost batch normalization. Every comparison is against plain Keras at the
big batch from the same initial weights on the same examples in the same
order (harness/keras_exactness.py holds the model, the optimizers and the
data; its table adds MultiWorkerMirroredStrategy, which
tests/integration/test_keras_tf2_cluster.py runs)."""

import functools
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum as ea
from estimator_accum.checkpoints import state_variables as estimator_accum_state
from harness import keras_exactness as kx

# The wrapper runs on Keras 2: TensorFlow 2.15's tf.keras, tf-keras on 2.16+
# (under Keras 3 the wrapper is keras3.py's: tests/unit/keras/test_keras3.py).
pytestmark = pytest.mark.keras2

K, B = kx.K, kx.MICRO_BATCH
WINDOW_STATE = "gradient_accumulation"


@pytest.fixture(autouse=True)
def _float32_afterwards():
  yield
  tf.keras.mixed_precision.set_global_policy("float32")


def _strategy(name):
  return (kx.mirrored_strategy() if name == "mirrored"
          else tf.distribute.get_strategy())


def _assert_close(actual, expected, what, rtol=1e-5, atol=1e-6):
  assert sorted(actual) == sorted(expected), what
  for name in expected:
    np.testing.assert_allclose(actual[name], expected[name], rtol=rtol,
                               atol=atol, err_msg=f"{what}: {name}")


def _moved(before, after):
  return max(float(np.max(np.abs(after[n] - before[n]))) for n in before)


@functools.cache
def _float32_pair(optimizer, strategy):
  """kx.train_pair in float32, trained once per module for the tests that
  read it (deterministic: the same weights whichever test asks first)."""
  return kx.train_pair(optimizer, _strategy(strategy), "float32")


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
@pytest.mark.parametrize("optimizer", sorted(kx.OPTIMIZERS))
def test_fit_equals_the_big_batch(optimizer, strategy):
  """SGD, momentum with clipnorm and a schedule, Adam with global_clipnorm
  and a schedule, AdamW with weight decay, clipnorm and an EMA (its
  averages compared too, and written into the model at fit's end), legacy
  Adam: weights at 1e-5, and one update per window of the inner
  optimizer (its iterations, bias correction, schedule and EMA)."""
  big, accumulated, counts = _float32_pair(optimizer, strategy)
  assert counts == {"big": kx.WINDOWS,
                    "accumulated": (K * kx.WINDOWS, kx.WINDOWS)}
  initial = {w.name: w.numpy() for w in kx.make_model(
      optimizer not in kx.CLIPPING).weights}
  assert _moved(initial, {n: big[n] for n in initial}) > 1e-3
  _assert_close(accumulated, big, f"{optimizer} {strategy}")


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
def test_fused_apply_in_fit_equals_the_big_batch(strategy):
  """fused_apply in model.fit: on one device the whole apply is one
  compiled function (AdamW with clipnorm and an EMA, dense gradients),
  under MirroredStrategy each variable's update is compiled apart."""
  big = _float32_pair("adamw", strategy)[0]
  _, accumulated, counts = kx.train_pair(
      "adamw", _strategy(strategy), "float32", train_big=False,
      fused_apply=True)
  assert counts["accumulated"] == (K * kx.WINDOWS, kx.WINDOWS)
  _assert_close(accumulated, big, f"fused adamw {strategy}")


@pytest.mark.parametrize("strategy", ["one", pytest.param("mirrored", marks=pytest.mark.slow)])
def test_mixed_float16_is_as_close_to_float32_as_keras_own(strategy):
  """In mixed_float16 the window and Keras's big batch round to float16 in
  different places; the window is no further from float32 training than
  kx.MIXED_FACTOR times Keras's own mixed-precision big batch is."""
  reference, _, _ = _float32_pair("adam", strategy)
  big, accumulated, counts = kx.train_pair("adam", _strategy(strategy),
                                           "mixed_float16")
  assert counts["accumulated"] == (K * kx.WINDOWS, kx.WINDOWS)
  keras = kx.relative_difference(big, reference)
  ours = kx.relative_difference(accumulated, reference)
  assert keras > 1e-5  # (mixed precision did round)
  assert ours <= kx.MIXED_FACTOR * keras, (ours, keras)


class _CustomStep(tf.keras.Model):
  """The question's train_step: a tape, the loss scaled and the gradients
  unscaled by a loss-scale optimizer (as Keras's mixed precision guide
  writes it), and `optimizer.apply_gradients`."""

  def train_step(self, data):
    x, y = data
    scaling = isinstance(self.optimizer,
                         tf.keras.mixed_precision.LossScaleOptimizer)
    with tf.GradientTape() as tape:
      loss = self.compiled_loss(y, self(x, training=True))
      scaled = self.optimizer.get_scaled_loss(loss) if scaling else loss
    gradients = tape.gradient(scaled, self.trainable_variables)
    if scaling:
      gradients = self.optimizer.get_unscaled_gradients(gradients)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    return {"loss": loss}


def _custom_step_weights(optimizer, batch, policy, strategy):
  tf.keras.mixed_precision.set_global_policy(policy)
  with strategy.scope():
    base = kx.make_model(sparse=False)
    model = _CustomStep(base.inputs, base.outputs)
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))
  data = kx.make_data(strategy.num_replicas_in_sync * K * B * kx.WINDOWS)
  model.fit(tf.data.Dataset.from_tensor_slices(data).batch(batch), verbose=0)
  tf.keras.mixed_precision.set_global_policy("float32")
  return {w.name: w.numpy() for w in model.weights}, model


@pytest.mark.parametrize("policy", [
    "float32", pytest.param("mixed_float16", marks=pytest.mark.slow)])
def test_the_questions_custom_train_step_under_mirrored_strategy(policy):
  """A custom train_step calling apply_gradients, mixed_float16 (Keras
  wraps the plain optimizer in its LossScaleOptimizer; the accumulating one
  is one already), MirroredStrategy: no merge_call error, the big batch's
  weights (1e-5 in float32; in mixed_float16 as close to float32 as
  Keras's own)."""
  strategy = kx.mirrored_strategy()
  replicas = strategy.num_replicas_in_sync

  def plain():
    return tf.keras.optimizers.Adam(0.01)

  def accumulating():
    return ea.AccumulatingKerasOptimizer(plain(), k=K)

  big, big_model = _custom_step_weights(plain, replicas * K * B, policy,
                                        strategy)
  accumulated, model = _custom_step_weights(accumulating, replicas * B,
                                            policy, strategy)
  assert int(model.optimizer.inner_optimizer.iterations.numpy()) == kx.WINDOWS
  if policy == "float32":
    _assert_close(accumulated, big, "custom train_step")
    return
  assert isinstance(big_model.optimizer,
                    tf.keras.mixed_precision.LossScaleOptimizer)
  assert model.optimizer.dynamic and model.optimizer.loss_scale == 2.0 ** 15
  reference, _ = _custom_step_weights(plain, replicas * K * B, "float32",
                                      strategy)
  keras = kx.relative_difference(big, reference)
  ours = kx.relative_difference(accumulated, reference)
  assert ours <= kx.MIXED_FACTOR * keras, (ours, keras)


class _ScaleRecorder(tf.keras.callbacks.Callback):
  def __init__(self):
    super().__init__()
    self.scales = []

  def on_train_batch_end(self, batch, logs=None):
    self.scales.append(float(self.model.optimizer.loss_scale))


def _overflow_run(data, windows):
  tf.keras.mixed_precision.set_global_policy("mixed_float16")
  model = kx.make_model(sparse=False)
  # Keras's LossScaleOptimizer given: the window takes its settings.
  inner = tf.keras.mixed_precision.LossScaleOptimizer(
      tf.keras.optimizers.SGD(0.1), initial_scale=2.0 ** 8)
  model.compile(optimizer=ea.AccumulatingKerasOptimizer(inner, k=K),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  recorder = _ScaleRecorder()
  model.fit(tf.data.Dataset.from_tensor_slices(data).batch(B), verbose=0,
            callbacks=[recorder])
  tf.keras.mixed_precision.set_global_policy("float32")
  assert int(model.optimizer.iterations.numpy()) == K * windows
  state = {v.name.split(":")[0]: v.numpy() for v in model.optimizer.variables
           if v.name.startswith(WINDOW_STATE)}
  return {w.name: w.numpy() for w in model.weights}, recorder.scales, state


def test_a_window_with_an_overflowing_micro_batch_is_skipped_whole():
  """mixed_float16: a micro-batch whose forward overflows float16 makes its
  whole window skipped (no update, the other micro-batches' gradients
  dropped too), the loss scale is halved once, at that window's end, and
  training goes on as if the window had not been there."""
  windows = 4
  x, labels = kx.make_data(K * B * windows)
  x = dict(x)
  x["x"] = x["x"].copy()
  x["x"][K * B + B:K * B + 2 * B] = 1e5  # window 1, its 2nd micro-batch
  weights, scales, state = _overflow_run((x, labels), windows)
  assert state[WINDOW_STATE + "/skipped_windows"] == 1
  assert state[WINDOW_STATE + "/updates_applied"] == windows - 1
  # Halved once, when window 1 ended; steady inside every window.
  assert scales == [2.0 ** 8] * (2 * K - 1) + [2.0 ** 7] * (2 * K + 1)
  kept = {key: np.concatenate([value[:K * B], value[2 * K * B:]])
          for key, value in x.items()}
  without, _, _ = _overflow_run((kept, np.concatenate(
      [labels[:K * B], labels[2 * K * B:]])), windows - 1)
  # Scaling by powers of two is exact in float16: the same weights.
  _assert_close(weights, without, "window skipped", rtol=1e-6, atol=1e-7)


def _collectives(model):
  """{function name: collective ops} of the model's traced train step and
  the functions it calls (a cond's branches among them)."""
  concrete = model.train_function._list_all_concrete_functions()  # noqa: SLF001
  found = {}
  for function in concrete:
    graph = function.graph.as_graph_def()
    bodies = [("train_step", graph.node)] + [
        (f.signature.name, f.node_def) for f in graph.library.function]
    for name, nodes in bodies:
      ops = [n.name for n in nodes if n.op.startswith("CollectiveReduce")]
      if ops:
        found.setdefault(name, []).extend(ops)
  return found


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_gradients_cross_replicas_only_at_the_windows_end(policy):
  """The train step's collectives (MirroredStrategy reduces CPU replicas
  with them) are all inside the window's end branch, run once per window;
  plain Keras's are in the step, run every step."""
  strategy = kx.mirrored_strategy()
  tf.keras.mixed_precision.set_global_policy(policy)
  data = kx.make_data(2 * K * B)
  models = {}
  for kind, optimizer in (
      ("plain", lambda: tf.keras.optimizers.Adam(0.01)),
      ("window", lambda: ea.AccumulatingKerasOptimizer(
          tf.keras.optimizers.Adam(0.01), k=K))):
    models[kind] = kx._compiled(optimizer, strategy, True)  # noqa: SLF001
    models[kind].fit(tf.data.Dataset.from_tensor_slices(data).batch(2 * B),
                     verbose=0)
  ours = _collectives(models["window"])
  assert ours and all("end_of_window" in name for name in ours), ours
  assert any("end_of_window" not in name
             for name in _collectives(models["plain"]))


@pytest.mark.parametrize("strategy", ["one", pytest.param("mirrored", marks=pytest.mark.slow)])
def test_a_short_last_micro_batch_weighs_its_examples(strategy):
  """An epoch of 50 examples in micro-batches of 4 per replica ends with a
  short one, inside a window: that window equals one batch of its
  examples (the micro-batches weighted by their examples, found in Keras's
  input pipeline), as do the others."""
  strategy = _strategy(strategy)
  replicas = strategy.num_replicas_in_sync
  size = replicas * B
  data = kx.make_data(50)
  micro = [{key: value[i:i + size] for key, value in data[0].items()}
           for i in range(0, 50, size)] * 2
  labels = [data[1][i:i + size] for i in range(0, 50, size)] * 2
  windows = [range(i, i + K) for i in range(0, len(micro) - K + 1, K)]

  def joined(parts, window):
    if isinstance(parts[0], dict):
      return {key: np.concatenate([parts[i][key] for i in window])
              for key in parts[0]}
    return np.concatenate([parts[i] for i in window])

  big = kx._compiled(lambda: tf.keras.optimizers.Adam(0.01), strategy,  # noqa: SLF001
                     True)
  for window in windows:
    big.fit(joined(micro, window), joined(labels, window),
            batch_size=sum(len(labels[i]) for i in window), verbose=0)
  accumulated = kx._compiled(  # noqa: SLF001
      lambda: ea.AccumulatingKerasOptimizer(tf.keras.optimizers.Adam(0.01),
                                            k=K), strategy, True)
  accumulated.fit(data[0], data[1], batch_size=size, epochs=2, shuffle=False,
                  verbose=0)
  assert int(accumulated.optimizer.inner_optimizer.iterations.numpy()) == len(
      windows)
  assert any(len(labels[i]) < size for w in windows for i in w)
  _assert_close({w.name: w.numpy() for w in accumulated.weights},
                {w.name: w.numpy() for w in big.weights}, "short micro-batch")


def _model_at(batches, optimizer=None):
  """A model trained on the first `batches` micro-batches of the data."""
  model = kx._compiled(optimizer or (lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.Adam(0.01), k=K)), tf.distribute.get_strategy(),
      True)
  data = kx.make_data(K * B * kx.WINDOWS)
  dataset = tf.data.Dataset.from_tensor_slices(data).batch(B)
  model.fit(dataset.take(batches), verbose=0)
  return model, dataset


def _weights(model):
  return {w.name: w.numpy() for w in model.weights}


@functools.cache
def _whole_weights():
  """The weights of training on every micro-batch without a stop (once a
  process: the tests that stop and resume compare with it)."""
  return _weights(_model_at(K * kx.WINDOWS)[0])


@pytest.mark.slow  # trains, saves and trains on again
def test_a_checkpoint_mid_window_resumes_exactly(tmp_path):
  """tf.train.Checkpoint of the model and its optimizer one micro-batch
  into a window, restored into a new model that trains on: the weights of
  training without the stop."""
  stopped, dataset = _model_at(K + 1)
  assert int(stopped.optimizer.iterations.numpy()) == K + 1
  path = tf.train.Checkpoint(model=stopped).save(str(tmp_path / "ckpt"))
  resumed = kx._compiled(lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.Adam(0.01), k=K), tf.distribute.get_strategy(),
      True)
  restored = tf.train.Checkpoint(model=resumed).restore(path)
  resumed.fit(dataset.skip(K + 1), verbose=0)
  # The window's state waited for the window, built in the first step.
  restored.assert_consumed()
  _assert_close(_weights(resumed), _whole_weights(), "resumed")


@pytest.mark.slow  # trains, saves and trains on again
def test_a_keras_file_keeps_the_window(tmp_path):
  """model.save to a .keras file one micro-batch into a window, loaded with
  load_model (no custom_objects), trained on: the weights of training
  without the stop."""
  stopped, dataset = _model_at(K + 1)
  stopped.save(tmp_path / "model.keras")
  loaded = tf.keras.models.load_model(
      tmp_path / "model.keras",
      custom_objects={"_OneHotEmbedding": kx._OneHotEmbedding})  # noqa: SLF001
  assert isinstance(loaded.optimizer, ea.AccumulatingKerasOptimizer)
  assert int(loaded.optimizer.iterations.numpy()) == K + 1
  loaded.fit(dataset.skip(K + 1), verbose=0)
  _assert_close(_weights(loaded), _whole_weights(), "loaded")


def _store_of(model, rename):
  """A `.keras` file's optimizer store of `model`, its window keys
  rewritten by `rename(key) -> key`."""
  return {rename(key) if key.startswith("window:") else key: value.numpy()
          for key, value in model.optimizer._state_by_key().items()}  # noqa: SLF001


def _resumed_from(stopped, store):
  """A new model with `stopped`'s weights and its optimizer state from
  `store`, as Keras loads a `.keras` file."""
  model = kx._compiled(lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.Adam(0.01), k=K), tf.distribute.get_strategy(),
      True)
  model.set_weights(stopped.get_weights())
  model.optimizer.build(model.trainable_variables)
  model.optimizer.load_own_variables(store)
  return model


@pytest.mark.slow  # trains, and trains on again
def test_window_state_of_an_earlier_file_format_loads_by_name():
  """`.keras` files of earlier versions key the window's state by name
  alone (`window:<name>`); this one adds its position
  (`window:<i>:<name>`), by which a SavedModel loaded inside a strategy's
  scope, whose state is named anew, finds it."""
  stopped, dataset = _model_at(K + 1)
  keys = [k for k in stopped.optimizer._state_by_key() if k.startswith(  # noqa: SLF001
      "window:")]
  assert keys and all(re.fullmatch(r"window:\d+:[^:]+", k) for k in keys)
  resumed = _resumed_from(stopped, _store_of(
      stopped, lambda key: "window:" + key.split(":", 2)[2]))
  resumed.fit(dataset.skip(K + 1), verbose=0)
  _assert_close(_weights(resumed), _whole_weights(), "earlier format")


def test_window_state_of_another_model_is_refused():
  stopped, dataset = _model_at(K + 1)
  # Names no state of this window has, and one value of the wrong shape.
  store = _store_of(stopped, lambda key: key + "_elsewhere")
  store["window:0:other%2Faccum_elsewhere"] = np.zeros([7, 7], np.float32)
  resumed = _resumed_from(stopped, store)
  with pytest.raises(ValueError, match=r"matches no state of this window by "
                     r"name, nor by position and shape"):
    resumed.fit(dataset.skip(K + 1), verbose=0)


def _fit_epochs(epochs, callbacks, verbose=0):
  """A model with the wrapper fit for `epochs` epochs of 5 micro-batches
  (k=3: epochs end inside windows) with `callbacks`."""
  model = kx._compiled(lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.Adam(0.01), k=K), tf.distribute.get_strategy(), True)
  model.fit(tf.data.Dataset.from_tensor_slices(kx.make_data(5 * B)).batch(B),
            epochs=epochs, verbose=verbose, callbacks=callbacks)
  return model


class _StopAtEpoch(tf.keras.callbacks.Callback):
  def on_epoch_begin(self, epoch, logs=None):
    if epoch == 1:
      raise RuntimeError("stopped")


@pytest.mark.slow  # trains, saves and trains on again
@pytest.mark.parametrize("verbose", [0, 1])
def test_backup_and_restore_at_epochs_resumes_exactly(tmp_path, verbose):
  """BackupAndRestore (backups at each epoch's end, its default): a job
  stopped in epoch 2 of 3, whose epochs end inside windows, fit again
  from the backup, ends as the job that was never stopped. With fit's
  default progress bar (verbose=1, batch hooks) the backup records the
  epoch's last batch, which Keras ignores at epochs: before, that was
  refused as a backup in steps."""
  def fit(callbacks):
    return _fit_epochs(3, callbacks, verbose)

  whole = fit([])
  backup = tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
  with pytest.raises(RuntimeError, match="stopped"):
    fit([backup, _StopAtEpoch()])
  resumed = fit([tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
  assert int(resumed.optimizer.iterations.numpy()) == 15
  _assert_close(_weights(resumed), _weights(whole), "restored")


class _StopAtBatch(tf.keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    if batch == 3:
      raise RuntimeError("stopped")


def test_backup_and_restore_in_steps_is_refused_in_one_line(tmp_path):
  """BackupAndRestore(save_freq=2): Keras resumes a backup written inside
  an epoch by replaying the epoch's first batches, which the window would
  add twice: refused when it is restored, saying what to use instead."""
  def fit(callbacks):
    _fit_epochs(2, callbacks)

  backup = str(tmp_path / "backup")
  with pytest.raises(RuntimeError, match="stopped"):
    fit([tf.keras.callbacks.BackupAndRestore(backup, save_freq=2),
         _StopAtBatch()])
  with pytest.raises(ValueError, match="save_freq='epoch'"):
    fit([tf.keras.callbacks.BackupAndRestore(backup, save_freq=2)])


@pytest.mark.parametrize("strategy", ["one", "mirrored"])
def test_window_batch_normalization_is_keras_ghost_batch_normalization(
    strategy):
  """WindowBatchNormalization at k micro-batches of B equals Keras's
  BatchNormalization(virtual_batch_size=B) at k x B: the weights and the
  moving mean and variance, moved once per window. Keras's virtual batch j
  of a batch holds its examples j, j + k, j + 2k, ...: the big batches
  interleave the micro-batches so that its virtual batches are them."""
  strategy = _strategy(strategy)
  replicas = strategy.num_replicas_in_sync
  rng = np.random.RandomState(0)
  x = (rng.normal(size=(2 * replicas * K * B, 5)) * 3 + 1).astype(np.float32)
  y = rng.normal(size=(len(x), 1)).astype(np.float32)

  def model(normalization, optimizer):
    with strategy.scope():
      tf.keras.utils.set_random_seed(1)
      net = tf.keras.Sequential([
          tf.keras.layers.Dense(8, use_bias=False, input_shape=(5,)),
          normalization, tf.keras.layers.Activation("tanh"),
          tf.keras.layers.Dense(1)])
      net.compile(optimizer=optimizer, loss="mse")
    return net

  def interleaved(values):
    out = []
    size = replicas * B
    for start in range(0, len(values), K * size):
      window = values[start:start + K * size]
      for replica in range(replicas):
        micro = [window[m * size + replica * B:m * size + (replica + 1) * B]
                 for m in range(K)]
        out.append(np.stack(micro, axis=1).reshape((K * B,) +
                                                   values.shape[1:]))
    return np.concatenate(out)

  big = model(tf.keras.layers.BatchNormalization(momentum=0.5,
                                                 virtual_batch_size=B),
              tf.keras.optimizers.Adam(0.05))
  big.fit(interleaved(x), interleaved(y), batch_size=replicas * K * B,
          shuffle=False, verbose=0)
  accumulated = model(ea.WindowBatchNormalization(k=K, momentum=0.5),
                      ea.AccumulatingKerasOptimizer(
                          tf.keras.optimizers.Adam(0.05), k=K))
  accumulated.fit(x, y, batch_size=replicas * B, shuffle=False, verbose=0)
  # (Keras's ghost layer keeps its weights in the virtual batches' shape.)
  keras = {w.name: w.numpy().ravel() for w in big.weights}
  ours = dict(zip(keras, [w.numpy().ravel() for w in accumulated.weights
                          if "/window_" not in w.name]))
  moving_mean = next(n for n in keras if "moving_mean" in n)
  assert not np.allclose(keras[moving_mean], 0.0)
  _assert_close(ours, keras, f"batch normalization, {strategy}")


def test_run_eagerly_is_refused_in_one_line():
  model = kx._compiled(lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.Adam(0.01), k=K), tf.distribute.get_strategy(), True)
  model.compile(optimizer=model.optimizer, loss=model.loss, run_eagerly=True)
  with pytest.raises(RuntimeError, match="compile without run_eagerly=True"):
    model.fit(tf.data.Dataset.from_tensor_slices(kx.make_data(B)).batch(B),
              verbose=0)


def test_a_loss_scale_optimizer_around_the_wrapper_is_refused():
  optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
      ea.AccumulatingKerasOptimizer(tf.keras.optimizers.Adam(0.01), k=K))
  model = kx._compiled(lambda: optimizer, tf.distribute.get_strategy(), True)  # noqa: SLF001
  with pytest.raises(ValueError, match="scales the loss itself"):
    model.fit(tf.data.Dataset.from_tensor_slices(kx.make_data(B)).batch(B),
              verbose=0)


def test_keras_callbacks_set_the_inner_learning_rate():
  """LearningRateScheduler sets `learning_rate`, which is the inner
  optimizer's: the updates use it."""
  model = kx._compiled(lambda: ea.AccumulatingKerasOptimizer(  # noqa: SLF001
      tf.keras.optimizers.SGD(0.1), k=K), tf.distribute.get_strategy(), True)
  model.fit(tf.data.Dataset.from_tensor_slices(kx.make_data(K * B)).batch(B),
            verbose=0, callbacks=[
                tf.keras.callbacks.LearningRateScheduler(lambda epoch: 0.025)])
  assert float(model.optimizer.inner_optimizer.learning_rate) == np.float32(0.025)


@pytest.mark.parametrize("argument, value", [
    ("virtual_batch_size", 4), ("renorm", True), ("synchronized", True)])
def test_window_batch_normalization_refuses_what_it_cannot_honour(argument,
                                                                  value):
  with pytest.raises(ValueError, match=f"does not take {argument}="):
    ea.WindowBatchNormalization(k=2, **{argument: value})


def test_xla_is_refused_in_one_line():
  model = kx.make_model(sparse=True)
  model.compile(optimizer=ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(0.01), k=K), jit_compile=True,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  with pytest.raises(RuntimeError, match="compile with jit_compile=False"):
    model.fit(tf.data.Dataset.from_tensor_slices(kx.make_data(B)).batch(B),
              verbose=0)


def test_trained_variables_of_one_name_each_keep_their_own_window():
  # TensorFlow 2 variables need not have distinct names, and the window
  # keys each one's state by a name. Keras's load_model of a SavedModel
  # inside a strategy's scope names a model's kernels so. Once these two
  # shared one accumulator and trained silently wrong, then they were
  # refused; now the second is keyed `w_2` (a third is named `w_1`).
  first = tf.Variable(tf.ones([2]), name="w")
  second = tf.Variable(tf.ones([2]), name="w")
  third = tf.Variable(tf.ones([2]), name="w_1")
  optimizer = ea.AccumulatingKerasOptimizer(tf.keras.optimizers.SGD(0.1), k=2)
  variables = [first, second, third]

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = (tf.reduce_sum(first) + 3.0 * tf.reduce_sum(second) +
              5.0 * tf.reduce_sum(third))
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

  step()
  np.testing.assert_array_equal(first.numpy(), [1.0, 1.0])  # mid-window
  step()
  for variable, gradient in zip(variables, [1.0, 3.0, 5.0]):
    np.testing.assert_allclose(variable.numpy(), [1.0 - 0.1 * gradient] * 2,
                               rtol=1e-6)
  names = [estimator_accum_state.variable_base_name(v) for v in variables]
  assert names == ["w", "w_2", "w_1"]
