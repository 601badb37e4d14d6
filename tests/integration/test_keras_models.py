"""Keras models compiled with an accumulating optimizer.

Turned into an Estimator by `tf.keras.estimator.model_to_estimator` and
trained in three `train()` calls that stop in the middle of windows, a model
ends with the weights and optimizer slots of the plain optimizer's big batch
(one call), in either checkpoint format, on one device and under
MirroredStrategy. Trained by `model.fit` in graph mode, it ends with the big
batch's weights."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum as ea
from harness import support
from tests.jobs import canned_job

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

K, MICRO_BATCH, UPDATES = 3, 8, 4
# Each stop but the last is in the middle of a window.
STOPS = (2, 7, K * UPDATES)
_X, _Y = canned_job.X, canned_job.Y
_SESSION = tf.compat.v1.ConfigProto(device_count={"CPU": 2})


def _keras_model(optimizer):
  tf.keras.utils.set_random_seed(1)
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,),
                            name="hidden"),
      tf.keras.layers.Dense(1, name="out")])
  model.compile(optimizer=optimizer, loss="mse")
  return model


def _train(optimizer, batch, stops, model_dir, checkpoint_format,
           strategy=None):
  """Trains in one train() call per stop, each reading on from where the
  checkpoint's step left off; returns the checkpoint's values."""
  model = _keras_model(optimizer)
  estimator = tf.keras.estimator.model_to_estimator(
      keras_model=model, model_dir=model_dir,
      checkpoint_format=checkpoint_format,
      config=tf.estimator.RunConfig(train_distribute=strategy,
                                    session_config=_SESSION))
  feature = model.input_names[0]
  replicas = strategy.num_replicas_in_sync if strategy else 1
  for stop in stops:
    done = _global_step(estimator) if estimator.latest_checkpoint() else 0

    def input_fn(done=done):
      return tf.data.Dataset.from_tensor_slices(({feature: _X}, _Y)).batch(
          batch).repeat().skip(done * replicas)

    estimator.train(input_fn, max_steps=stop)
  return {name: estimator.get_variable_value(name)
          for name in estimator.get_variable_names()
          if "OBJECT_GRAPH" not in name}


def _global_step(estimator):
  (name,) = [n for n in estimator.get_variable_names() if "global_step" in n]
  return int(estimator.get_variable_value(name))


@pytest.mark.estimator
@pytest.mark.parametrize("api, checkpoint_format, replicas", [
    ("keras", "checkpoint", 1),
    ("keras", "saver", 1),
    ("v1", "checkpoint", 1),
    ("keras", "checkpoint", 2),
])
def test_model_to_estimator_resumed_mid_window_equals_big_batch(
    api, checkpoint_format, replicas, tmp_path):
  if api == "keras":
    plain = canned_job.KERAS_OPTIMIZERS["adam"]
    wrap = ea.AccumulatingKerasOptimizer
  else:
    plain = canned_job.V1_OPTIMIZERS["adam"]
    wrap = ea.AccumulatingOptimizer
  expected = _train(plain(), replicas * K * MICRO_BATCH, [UPDATES],
                    str(tmp_path / "big"), checkpoint_format)
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
              if replicas > 1 else None)
  actual = _train(wrap(plain(), K), MICRO_BATCH, STOPS,
                  str(tmp_path / "accumulated"), checkpoint_format, strategy)
  # The wrapper takes the plain optimizer's place: its slots and
  # hyperparameters are under the plain optimizer's keys.
  missing = sorted(set(expected) - set(actual))
  assert not missing, missing
  slots = [n for n in expected if "OPTIMIZER_SLOT" in n or "/Adam" in n]
  assert len(slots) >= 8, sorted(expected)
  steps = [n for n in expected if "global_step" in n]
  assert [actual[n] for n in steps] == [K * UPDATES]
  support.assert_weights_close(
      {n: actual[n] for n in expected if n not in steps},
      {n: expected[n] for n in expected if n not in steps},
      what=f"{api} {checkpoint_format} x{replicas}")
  # The window's counters under the optimizer; its accumulators as slots
  # of the trained variables, keyed by their paths in the model.
  # (A v1 optimizer is under Keras's TFOptimizer: optimizer/optimizer.)
  key = (r"^(optimizer/)+window\.Supdates_applied/" if checkpoint_format ==
         "checkpoint" else "^gradient_accumulation/updates_applied$")
  (updates,) = [v for n, v in actual.items() if re.search(key, n)]
  assert updates == UPDATES
  accumulators = [n for n in actual if re.search(
      r"\.OPTIMIZER_SLOT/(optimizer/)+window_accum/|/accum$", n)]
  assert len(accumulators) == 4, sorted(actual)


@pytest.mark.estimator
def test_stopped_mid_window_the_window_is_in_the_checkpoint(tmp_path):
  """The object-based checkpoint at a stop in the middle of a window holds
  the window's sum, under MirroredStrategy the sum over both replicas."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  actual = _train(ea.AccumulatingKerasOptimizer(
      canned_job.KERAS_OPTIMIZERS["sgd"](), K, summaries=False),
      MICRO_BATCH, [2], str(tmp_path / "stopped"), "checkpoint", strategy)
  (kernel,) = [v for n, v in actual.items() if n.startswith(
      "layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/window_accum/")]
  # The mean's share of 2 micro-batches on each of 2 replicas: nonzero.
  assert np.abs(kernel).max() > 1e-3
  # The same micro-batches' gradients, as the window holds them: the sum
  # over the 4 micro-batches of gradient / (k * replicas).
  model = _keras_model(tf.keras.optimizers.legacy.SGD(0.0))
  variable = model.layers[0].kernel
  total = np.zeros(variable.shape, np.float32)
  for step in range(4):
    rows = slice(step * MICRO_BATCH, (step + 1) * MICRO_BATCH)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(_X[rows]) - _Y[rows]))
    total += tape.gradient(loss, variable).numpy() / (K * 2)
  np.testing.assert_allclose(kernel, total, rtol=1e-5, atol=1e-7)


@pytest.mark.keras2
def test_config_makes_an_equal_wrapper_around_a_new_optimizer():
  wrapper = ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.legacy.Adam(0.05, beta_1=0.8), 4, clip_norm=2.0,
      reduction="sum", accumulator_dtype=tf.float32, name="window")
  config = wrapper.get_config()
  json.dumps(config)  # Plain data: a Keras inner optimizer serializes.
  copy = ea.AccumulatingKerasOptimizer.from_config(config)
  assert copy.k == 4
  assert copy.get_config() == config
  assert copy.optimizer is not wrapper.optimizer
  assert type(copy.optimizer) is type(wrapper.optimizer)
  assert copy.optimizer.get_config() == wrapper.optimizer.get_config()
  assert config["clip_norm"] == 2.0 and config["reduction"] == "sum"
  assert config["name"] == "window"


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer_name, replicas", [
    ("adam", 1), ("sgd", 1), ("adam", 2)])
def test_keras_fit_in_graph_mode_equals_big_batch(optimizer_name, replicas,
                                                  tmp_path):
  """model.fit under tf.compat.v1.disable_v2_behavior() (its own process),
  on one device and under MirroredStrategy over 2 logical CPUs: k
  micro-batches of B per replica per update give the weights of batch
  replicas*k*B on one device. Before this release the wrapper's window
  variables were not initialized there (Keras initializes the variables it
  knows of)."""
  output = tmp_path / "weights.npz"
  subprocess.run(
      [sys.executable, "tests/jobs/keras_fit_job.py", "--optimizer",
       optimizer_name, "--output", str(output), "--replicas", str(replicas)],
      check=True, capture_output=True, text=True, timeout=300)
  saved = np.load(output)
  names = sorted(n.split("__")[1] for n in saved.files if "big__" in n)
  assert len(names) == 4
  actual = {n: saved[f"accumulated__{n}"] for n in names}
  expected = {n: saved[f"big__{n}"] for n in names}
  for n in names:
    assert not np.allclose(actual[n], saved[f"initial__{n}"]), n
  support.assert_weights_close(actual, expected, what="model.fit")
  # 48 examples, 2 epochs, windows of 3 x 8 on each replica.
  assert saved["updates"] == 4 // replicas
  # An object-based checkpoint (save_weights) holds the open window: the
  # micro-batch count (the wrapper's own; the inner optimizer's count of
  # updates has the plain optimizer's key) and the accumulators.
  assert saved["saved__micro_batches"] == K * UPDATES // replicas + 1
  assert np.abs(saved["saved__accum"]).max() > 0
  assert saved["restored__micro_batches"] == saved["saved__micro_batches"]
  np.testing.assert_array_equal(saved["restored__accum"],
                                saved["saved__accum"])


@pytest.mark.keras2
@pytest.mark.parametrize("file_name", ["model.h5", "model.keras", "saved"])
def test_saved_compiled_model_loads_with_its_wrapper(file_name, tmp_path):
  """Keras saves the compiled optimizer's config and loads it back by its
  registered name: no custom_objects needed."""
  wrapper = ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.legacy.Adam(0.05), 4, clip_norm=1.0)
  model = _keras_model(wrapper)
  path = str(tmp_path / file_name)
  model.save(path)
  loaded = tf.keras.models.load_model(path)
  assert isinstance(loaded.optimizer, ea.AccumulatingKerasOptimizer)
  assert loaded.optimizer.get_config() == wrapper.get_config()


@pytest.mark.estimator
def test_a_mixed_float16_model_keeps_the_wrapper_which_scales_the_loss(
    tmp_path):
  """Under the mixed_float16 policy Keras's compile wraps a plain optimizer
  in a LossScaleOptimizer; the accumulating wrapper is one already and
  stays as it is, and its loss_scale="auto" scales the loss dynamically,
  read from the float16 in the loss: the first windows overflow at 2**15
  and are skipped, the scale halving once per skipped window, and the rest
  apply."""
  tf.keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    model = _keras_model(ea.AccumulatingKerasOptimizer(
        tf.keras.optimizers.legacy.Adam(0.05), K))
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")
  assert isinstance(model.optimizer, ea.AccumulatingKerasOptimizer)
  estimator = _train_mixed(model, tmp_path)
  value = estimator.get_variable_value
  skipped = value("gradient_accumulation/skipped_windows")
  assert 1 <= skipped < UPDATES
  assert value("gradient_accumulation/loss_scale") == 2.0**(15 - skipped)


@pytest.mark.estimator
def test_loss_scale_optimizer_around_the_wrapper_is_refused(tmp_path):
  """A Keras LossScaleOptimizer put around the wrapper by hand would skip
  and scale every micro-batch: refused, saying what to do instead."""
  model = _keras_model(tf.keras.mixed_precision.LossScaleOptimizer(
      ea.AccumulatingKerasOptimizer(tf.keras.optimizers.legacy.Adam(0.05),
                                    K)))
  # model_to_estimator builds the train step for its first checkpoint.
  with pytest.raises(ValueError, match="scales the loss itself"):
    tf.keras.estimator.model_to_estimator(keras_model=model,
                                          model_dir=str(tmp_path))


def _train_mixed(model, tmp_path):
  estimator = tf.keras.estimator.model_to_estimator(
      keras_model=model, model_dir=str(tmp_path), checkpoint_format="saver")

  def input_fn():
    return tf.data.Dataset.from_tensor_slices(
        ({model.input_names[0]: _X}, _Y)).batch(MICRO_BATCH).repeat()

  estimator.train(input_fn, max_steps=K * UPDATES)
  value = estimator.get_variable_value
  assert value("global_step") == K * UPDATES
  assert value("gradient_accumulation/updates_applied") + value(
      "gradient_accumulation/skipped_windows") == UPDATES
  return estimator


@pytest.mark.estimator
def test_float16_layers_with_the_wrappers_loss_scale(tmp_path):
  """Float16 layers in a float32 model, the wrapper scaling the loss. The
  first window overflows at the initial scale of 2**15 and is skipped; the
  scale halves and the rest apply."""
  tf.keras.utils.set_random_seed(1)
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,),
                            dtype="mixed_float16", name="hidden"),
      tf.keras.layers.Dense(1, dtype="float32", name="out")])
  model.compile(optimizer=ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.legacy.Adam(0.05), K, loss_scale="dynamic"),
      loss="mse")
  assert isinstance(model.optimizer, ea.AccumulatingKerasOptimizer)
  before = model.get_weights()
  value = _train_mixed(model, tmp_path).get_variable_value
  assert value("gradient_accumulation/skipped_windows") == 1
  assert value("gradient_accumulation/updates_applied") == UPDATES - 1
  assert value("gradient_accumulation/loss_scale") == 2.0**14
  assert value("hidden/kernel").dtype == np.float32
  assert not np.allclose(value("hidden/kernel"), before[0])


@pytest.mark.keras2
def test_parameter_server_windows_stay_out_of_object_checkpoints():
  """Between-graph (parameter-server) training keeps each worker's window
  in local variables, which name-based checkpoints leave out (each worker
  has its own); the wrapper does not put them in object-based ones either,
  where the chief's window would be restored into every worker."""
  with tf.Graph().as_default():
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        ps_tasks=1, worker_device="/job:worker/task:0")):
      step = tf.compat.v1.train.get_or_create_global_step()
      weight = tf.compat.v1.get_variable("w", [4, 1])
      loss = tf.reduce_mean(tf.square(tf.matmul(_X[:MICRO_BATCH], weight)))
      wrapper = ea.AccumulatingKerasOptimizer(
          tf.keras.optimizers.legacy.SGD(0.1), K)
      wrapper.iterations = step
      wrapper.get_updates(loss, [weight])
    local = tf.compat.v1.local_variables()
    assert any("accum" in v.name for v in local), local
    tracked = wrapper._trackable_children()
    assert not [n for n, v in tracked.items()
                if any(v is w for w in local)], sorted(tracked)
    assert "iter" in tracked  # The inner optimizer's, shared.
    # Nor as slots.
    assert wrapper.get_slot_names() == []
    assert wrapper.get_slot(weight, "window_accum") is None


def _resume(directory, output, *options):
  return subprocess.run(
      [sys.executable, "tests/jobs/keras_resume_job.py", "resume", str(directory),
       str(output), *options],
      check=True, capture_output=True, text=True, timeout=300).stdout


def _assert_resumed_equals_uninterrupted(output, initial):
  resumed = np.load(output / "resumed.npz")
  uninterrupted = np.load(output / "uninterrupted.npz")
  for name in uninterrupted.files:
    assert not np.allclose(uninterrupted[name], initial[name]), name
  support.assert_weights_close(
      {n: resumed[n] for n in resumed.files},
      {n: uninterrupted[n] for n in uninterrupted.files}, what="resumed fit")


@pytest.mark.keras2
@pytest.mark.parametrize("options", [
    (), ("--renamed",), ("--renamed", "--built")])
def test_keras_fit_resumed_in_a_new_process_from_save_weights(
    options, tmp_path):
  """save_weights in the middle of a window; a new process loads it and
  finishes the window: the weights of the same micro-batches in one fit.
  Loaded before its first fit (the window is built after the checkpoint is
  read) or after the window is built, into a model whose layers got other
  names (a second model built in one process gets `dense_2`...): the
  window's accumulators are keyed as slots of the model's variables, by
  their paths in the model, not by their names. Before, a renamed model was
  refused when loaded before the build and silently left with an empty
  window when loaded after it."""
  saved = tmp_path / "saved"
  saved.mkdir()
  subprocess.run(
      [sys.executable, "tests/jobs/keras_resume_job.py", "save", str(saved)],
      check=True, capture_output=True, text=True, timeout=300)
  output = tmp_path / "output"
  output.mkdir()
  _resume(saved, output, *options)
  _assert_resumed_equals_uninterrupted(output, np.load(saved / "initial.npz"))


@pytest.mark.keras2
def test_model_saved_mid_window_as_h5_resumes(tmp_path):
  """model.save to .h5 in the middle of a window, load_model, fit on: the
  weights of one uninterrupted fit. Keras's .h5 file holds the optimizer's
  `weights`, and sets them right after compile, before the window is built:
  the wrapper's are the micro-batch count, the inner optimizer's update
  count and slots, and the window's state, set when it is built (before,
  only the micro-batch count was saved: Adam restarted with the window)."""
  subprocess.run(
      [sys.executable, "tests/jobs/keras_resume_job.py", "h5", str(tmp_path)],
      check=True, capture_output=True, text=True, timeout=300)
  _assert_resumed_equals_uninterrupted(
      tmp_path, np.load(tmp_path / "initial.npz"))


@pytest.mark.keras2
def test_saved_model_loaded_into_the_graph_it_was_saved_from_says_why(
    tmp_path):
  """A Keras SavedModel (tf.compat.v1 graph mode) holds no window: the
  wrapper load_model makes from it refuses to train on, naming the cause
  and what keeps the window (it used to fail later, on the window state's
  names, which the model loaded into the same graph keeps)."""
  printed = subprocess.run(
      [sys.executable, "tests/jobs/keras_resume_job.py", "tf", str(tmp_path)],
      check=True, capture_output=True, text=True, timeout=300).stdout
  assert ("ValueError: this AccumulatingKerasOptimizer was loaded from a "
          "SavedModel, which does not hold its window") in printed, printed


_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                        "keras_window_0a07752")


@pytest.mark.keras2
@pytest.mark.parametrize("options", [(), ("--built",)])
def test_checkpoint_of_the_earlier_key_format_resumes(options, tmp_path):
  """A save_weights checkpoint written by estimator_accum 0a07752 (window
  state keyed by variable names; made by tests/jobs/keras_resume_job.py save)
  resumes exactly into a model with those names, loaded before or after the
  window is built."""
  _resume(_FIXTURE, tmp_path, *options)
  _assert_resumed_equals_uninterrupted(
      tmp_path, np.load(os.path.join(_FIXTURE, "initial.npz")))


@pytest.mark.keras2
@pytest.mark.parametrize("options", [("--renamed",), ("--renamed", "--built")])
def test_earlier_key_format_for_other_names_is_refused(options, tmp_path):
  """The same checkpoint loaded into a model whose variables are named
  otherwise: its window state cannot be matched, and is refused (before
  the window is built and after), not dropped."""
  printed = _resume(_FIXTURE, tmp_path, *options)
  assert "ValueError: the checkpoint being restored holds window state " \
      "['dense/bias/accum'" in printed, printed
  assert not os.path.exists(tmp_path / "resumed.npz")
