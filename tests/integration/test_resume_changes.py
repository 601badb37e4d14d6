"""Resuming with another k or another number of replicas, in real Estimators.

A checkpoint written mid-window holds part of a window. The run that resumes
from it may use another k (a bigger GPU, another recipe) or another number of
replicas (more or fewer devices). The window that straddles the change is
the mean of the micro-batches it holds, however many that is; every later
window is k micro-batches again, aligned on `global_step` as always. Each
case is compared with plain TensorFlow trained on the same groups of
examples, one big batch per window.
"""

import contextlib
import subprocess
import sys

import pytest
import tensorflow as tf

from harness import support

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

v1 = tf.compat.v1.train
MICRO_BATCH = 4


def _adam():
  return v1.AdamOptimizer(0.05)


def _resume(tmp_path, first, second, stop_at, total, **params):
  """Trains `stop_at` micro-batch steps with the settings `first`, then a new
  Estimator with `second` resumes from the checkpoint up to `total`.

  `first` and `second` are (k, replicas). Under R replicas a step takes R
  consecutive micro-batches of the data, one per replica.
  """
  (k_first, replicas_first), (k_second, replicas_second) = first, second
  batches = stop_at * replicas_first + (total - stop_at) * replicas_second
  data = support.make_data(MICRO_BATCH * batches)
  params = dict(params, optimizer_fn=_adam)
  before = support.make_estimator(
      tmp_path, dict(params, k=k_first),
      train_distribute=_strategy(replicas_first))
  before.train(support.micro_batch_input_fn(data, MICRO_BATCH),
               max_steps=stop_at)
  after = support.make_estimator(
      tmp_path, dict(params, k=k_second),
      train_distribute=_strategy(replicas_second))
  after.train(support.micro_batch_input_fn(
      data, MICRO_BATCH, skip=stop_at * replicas_first), max_steps=total)
  return data, after


def _strategy(replicas):
  if replicas == 1:
    return None
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(replicas)])


def _check(data, estimator, windows, total, what, clip_norm=None):
  """`windows` lists the examples of each window (each one big batch)."""
  expected = support.reference_train(_adam, data, windows, len(windows),
                                     clip_norm=clip_norm)
  actual = {n: estimator.get_variable_value(n) for n in support.weight_names()}
  support.assert_trained_like_big_batch(estimator, actual, expected, total,
                                        len(windows), what)


# (k before, k after, step of the stop, steps in all, examples per window)
K_CHANGES = {
    # Two micro-batches carried; k=2 ends their window two steps later.
    "4to2_mid_window": (4, 2, 6, 12, [16, 16, 8, 8]),
    # Stopped on a window boundary that is not one of k=8's: the window from
    # step 12 ends at step 15 with 4 micro-batches, then windows of 8.
    "4to8_boundary": (4, 8, 12, 24, [16, 16, 16, 16, 32]),
    # Two micro-batches carried into k=1: the next step ends a window of 3.
    "4to1_mid_window": (4, 1, 6, 9, [16, 12, 4, 4]),
    # From k=1 at step 6: the window ends at step 7 (2 micro-batches).
    "1to4": (1, 4, 6, 16, [4] * 6 + [8, 16, 16]),
    # One micro-batch carried into k=2: steps 3, 4, 5 make one window.
    "3to2_one_carried": (3, 2, 4, 10, [12, 12, 8, 8]),
}


@pytest.mark.estimator
@pytest.mark.parametrize("change", sorted(K_CHANGES))
def test_resume_with_another_k(change, tmp_path, capfd):
  k_first, k_second, stop_at, total, windows = K_CHANGES[change]
  data, estimator = _resume(tmp_path, (k_first, 1), (k_second, 1), stop_at,
                            total)
  _check(data, estimator, windows, total, f"resume k {change}")
  # Later windows are added with this run's divisor: no correction, no copy.
  assert estimator.get_variable_value(
      "gradient_accumulation/window_divisor") == k_second
  # One window straddles the change, and the graph says so once.
  notes = [line for line in capfd.readouterr().err.splitlines()
           if "micro-batches over all replicas, not" in line]
  ends = [sum(windows[:i + 1]) // MICRO_BATCH - 1 for i in range(len(windows))]
  straddling = next(i for i, end in enumerate(ends) if end >= stop_at)
  ends_at = ends[straddling]
  assert notes == [
      f"WARNING estimator_accum: the window ending at micro-batch {ends_at} "
      f"held {windows[straddling] // MICRO_BATCH} micro-batches over all "
      f"replicas, not {k_second} (k = {k_second} x replicas): a run resumed "
      "with another k or number of replicas; applied as their mean."], notes


OTHER_SETTINGS = {
    "running_mean": dict(reduction="running_mean"),
    "num_examples": dict(weight_by_examples=True),
    # The embedding's window kept as the rows it touched.
    "compact_table": dict(sparse_accumulation=True),
    # Clipped at half the first window's gradient norm: the straddling
    # window's rescale and the clipping are one product.
    "clipped": dict(clip_norm=0.5),
}


@pytest.mark.estimator
@pytest.mark.parametrize("setting", sorted(OTHER_SETTINGS))
@pytest.mark.parametrize("change", ["4to2_mid_window", "4to1_mid_window"])
def test_resume_with_another_k_other_settings(change, setting, tmp_path):
  k_first, k_second, stop_at, total, windows = K_CHANGES[change]
  params = dict(OTHER_SETTINGS[setting])
  if "clip_norm" in params:
    params["clip_norm"] *= float(support.reference_gradient_norm(
        support.make_data(MICRO_BATCH * total), windows[0]))
  data, estimator = _resume(tmp_path, (k_first, 1), (k_second, 1), stop_at,
                            total, **params)
  _check(data, estimator, windows, total, f"resume k {change}, {setting}",
         clip_norm=params.get("clip_norm"))


@pytest.mark.estimator
@pytest.mark.parametrize("reduction", ["mean", "running_mean"])
def test_resume_on_more_replicas(reduction, control_flow, tmp_path):
  """One device, k=4, stops two micro-batches (8 examples) into its second
  window; 2 replicas with k=2 resume: steps 6 and 7 add 16 examples to that
  window, then windows of 2 x 2 x 4 = 16 follow."""
  data, estimator = _resume(tmp_path, (4, 1), (2, 2), 6, 10,
                            reduction=reduction)
  _check(data, estimator, [16, 24, 16], 10,
         f"resume on 2 replicas, {reduction}, {control_flow}")


@pytest.mark.estimator
@pytest.mark.parametrize("reduction", ["mean", "running_mean"])
def test_resume_on_fewer_replicas(reduction, tmp_path):
  """2 replicas, k=2 (16 examples a window), stop after step 2 (8 examples
  carried); one device with k=4 resumes at step 3, the last of its window
  (12 examples), then a window of 16."""
  data, estimator = _resume(tmp_path, (2, 2), (4, 1), 3, 8,
                            reduction=reduction)
  _check(data, estimator, [16, 12, 16], 8,
         f"resume on one device, {reduction}")


@pytest.mark.estimator
def test_two_worker_checkpoint_resumed_on_one_device(tmp_path):
  """2 MultiWorkerMirroredStrategy workers, k=4: worker 1 dies after 3
  micro-batches and the chief's checkpoint of step 2 holds 2 x 2 micro-
  batches (16 examples) of the window. One device with k=2 resumes from it:
  steps 2 and 3 end that window (24 examples), steps 4 and 5 make one of 8.
  Worker w reads shard w, so step s covers examples 8s to 8s + 7 as a
  whole, as one device's consecutive micro-batches do."""
  workers, k, micro_batch = 2, 4, MICRO_BATCH
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(workers),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(k),
      "--micro_batch", str(micro_batch), "--updates", "1",
      "--die_at", "3", "--save_every", "2"]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode != 0
  assert "[worker:1] dying after 3 micro-batches" in result.stdout
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-2")
  # The job's data: make_data(workers * k * micro_batch * updates).
  data = support.make_data(workers * k * micro_batch)
  after = support.make_estimator(tmp_path, dict(optimizer_fn=_adam, k=2))
  after.train(support.micro_batch_input_fn(data, micro_batch, skip=4),
              max_steps=6)
  _check(data, after, [24, 8], 6, "2-worker checkpoint resumed on one device")


def _plain_model_fn(features, labels, mode, params):
  """The test model trained without accumulation: optimizer.minimize."""
  loss = support.model_loss(features, labels)
  train_op = params["optimizer_fn"]().minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.estimator
def test_start_from_a_checkpoint_written_without_accumulation(tmp_path):
  """A plain run's model_dir has no window state: resuming in it fails in
  TensorFlow's restore, naming an accumulator; warm-starting a new
  model_dir from it (TensorFlow's WarmStartSettings, which copies the
  trained variables) goes on exactly as the big batch would."""
  sgd = lambda: v1.GradientDescentOptimizer(0.5)  # noqa: E731
  data = support.make_data(4 * 2 * MICRO_BATCH)
  plain_dir = tmp_path / "plain"
  config = tf.estimator.RunConfig(model_dir=str(plain_dir), tf_random_seed=0)
  plain = tf.estimator.Estimator(_plain_model_fn, config=config,
                                 params=dict(optimizer_fn=sgd))
  plain.train(support.micro_batch_input_fn(data, 2 * MICRO_BATCH),
              max_steps=2)

  same_dir = support.make_estimator(plain_dir, dict(optimizer_fn=sgd, k=2))
  with pytest.raises(tf.errors.NotFoundError, match=r"/accum not found"):
    same_dir.train(support.micro_batch_input_fn(data, MICRO_BATCH),
                   max_steps=4)

  accumulating = tf.estimator.Estimator(
      support.accumulating_model_fn,
      config=config.replace(model_dir=str(tmp_path / "accumulating")),
      params=dict(optimizer_fn=sgd, k=2), warm_start_from=str(plain_dir))
  accumulating.train(support.micro_batch_input_fn(data, MICRO_BATCH, skip=4),
                     max_steps=4)
  expected = support.reference_train(sgd, data, 2 * MICRO_BATCH, 4)
  actual = {n: accumulating.get_variable_value(n)
            for n in support.weight_names()}
  support.assert_trained_like_big_batch(accumulating, actual, expected, 4, 2,
                                        "warm-started from a plain run")


def _keras_adam():
  return tf.keras.optimizers.legacy.Adam(0.05)


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_fn, first, second", [
    (_adam, "v1", "v2"), (_keras_adam, "v2", "v1")],
    ids=["v1_adam_cf_v1_to_v2", "keras_adam_cf_v2_to_v1"])
def test_resume_under_the_other_control_flow(optimizer_fn, first, second,
                                             tmp_path):
  """The optimizer's state is checkpointed under the names plain training
  gives it (`beta1_power`, `Adam/w/m`), whichever control flow built the
  window's branch: a job stopped mid-window under one (a TF1-style script
  calling disable_v2_behavior runs control flow v1) resumes under the
  other, exactly."""
  k, stop, total = 2, 3, 8
  data = support.make_data(MICRO_BATCH * total)
  params = dict(optimizer_fn=optimizer_fn, k=k)
  try:
    for control_flow, steps, skip in ((first, stop, 0), (second, total, stop)):
      if control_flow == "v1":
        tf.compat.v1.disable_control_flow_v2()
      else:
        tf.compat.v1.enable_control_flow_v2()
      estimator = support.make_estimator(tmp_path, params)
      estimator.train(support.micro_batch_input_fn(data, MICRO_BATCH,
                                                   skip=skip),
                      max_steps=steps)
  finally:
    tf.compat.v1.enable_control_flow_v2()
  expected = support.reference_train(optimizer_fn, data, k * MICRO_BATCH,
                                     total // k, minimize=False)
  actual = {n: estimator.get_variable_value(n) for n in support.weight_names()}
  support.assert_trained_like_big_batch(
      estimator, actual, expected, total, total // k,
      f"control flow {first}, then {second}")


def _optimizer_state_names(optimizer_fn, accumulate, scope):
  """The global variables a train op builds, besides the window's own."""
  import estimator_accum

  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    with tf.name_scope(scope) if scope else contextlib.nullcontext():
      weight = tf.compat.v1.get_variable("w", [3])
      loss = tf.reduce_sum(weight * 2.0)
      optimizer = optimizer_fn()
      if accumulate:
        estimator_accum.build_accumulating_train_op(loss, optimizer, 2)
      else:
        optimizer.apply_gradients(
            [(tf.compat.v1.gradients(loss, [weight])[0], weight)])
    del global_step
    window = set()
    if accumulate:
      state = estimator_accum.get_accumulation_state()
      window = {v.op.name for a in state.accumulators
                for v in a.state_variables()}
      window.update(v.op.name for v in (
          state.updates_applied, state.skipped_windows,
          state.applied_gradient_norm))
      window.update(f"gradient_accumulation/{name}" for name in (
          "window_micro_batches", "window_divisor"))
    return sorted(v.op.name for v in tf.compat.v1.global_variables()
                  if v.op.name not in window)


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer_fn", [_adam, _keras_adam],
                         ids=["v1_adam", "keras_adam"])
def test_optimizer_state_is_named_as_in_plain_training(optimizer_fn,
                                                       control_flow):
  for scope in (None, "train", "outer/inner"):
    names = _optimizer_state_names(optimizer_fn, True, scope)
    assert names == _optimizer_state_names(optimizer_fn, False, scope)
    if scope:
      assert any(name.startswith(scope + "/") for name in names), names
