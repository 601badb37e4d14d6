"""The window contract, checked in real Estimator runs against plain TensorFlow.

- nothing moves (weights or optimizer slots) before the k-th micro-batch;
- clip_norm equals clipping the big batch's gradient by global norm;
- a window with a NaN/Inf gradient is skipped whole and training goes on;
- a job stopped mid-window and restarted from its checkpoint loses nothing;
- uneven micro-batches weighted by num_examples equal the uneven big batch,
  and a loss over tokens weighted by token counts the big batch's;
- reduction="sum" and "running_mean".
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

v1 = tf.compat.v1.train


def _checkpoint_values(path):
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def _is_window_state(name):
  return (name.endswith("/accum") or name.endswith("/accum_rows") or
          name.startswith("gradient_accumulation/") or name == "global_step")


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_fn", [
    lambda: v1.AdamOptimizer(0.05),
    lambda: v1.MomentumOptimizer(0.1, 0.9),
], ids=["adam", "momentum"])
def test_nothing_moves_before_the_kth_micro_batch(optimizer_fn, control_flow,
                                                  tmp_path):
  k = 4
  data = support.make_data(k * 2 * 2)
  estimator = support.make_estimator(
      tmp_path, dict(optimizer_fn=optimizer_fn, k=k),
      save_checkpoints_steps=1, keep_checkpoint_max=20)
  estimator.train(support.micro_batch_input_fn(data, 2), max_steps=2 * k)

  snapshots = {step: _checkpoint_values(str(tmp_path / f"model.ckpt-{step}"))
               for step in range(2 * k + 1)}
  model_state = [n for n in snapshots[0] if not _is_window_state(n)]
  slots = [n for n in model_state if n not in support.weight_names()]
  assert slots, "the optimizer should have slot variables in the checkpoint"
  for step in range(2 * k + 1):
    assert snapshots[step]["global_step"] == step
    assert snapshots[step]["gradient_accumulation/updates_applied"] == step // k
  for step in range(1, 2 * k + 1):
    changed = [n for n in model_state
               if not np.array_equal(snapshots[step][n], snapshots[step - 1][n])]
    if step % k == 0:
      assert set(support.weight_names()) <= set(changed), (
          f"micro-batch {step} ends a window but left {changed} only changed")
    else:
      assert not changed, (
          f"micro-batch {step} is inside a window but changed {changed}")
  # The accumulators hold the window so far, and are cleared (sums and the
  # sparse one's touched-row mask) once the window is applied.
  accumulators = [n for n in snapshots[0] if "/accum" in n]
  for name in accumulators:
    assert np.any(snapshots[k - 1][name] != 0), name
    for step in (k, 2 * k):
      assert not np.any(snapshots[step][name]), (name, step)


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_clip_norm_equals_clipping_the_big_batch(optimizer_name, control_flow,
                                                 tmp_path):
  optimizer_fn = {"sgd": lambda: v1.GradientDescentOptimizer(0.5),
                  "adam": lambda: v1.AdamOptimizer(0.05)}[optimizer_name]
  k, micro_batch, updates = 4, 4, 3
  data = support.make_data(k * micro_batch * updates)
  clip_norm = 0.5 * support.reference_gradient_norm(data, k * micro_batch)
  expected = support.reference_train(optimizer_fn, data, k * micro_batch,
                                     updates, clip_norm=clip_norm)
  unclipped = support.reference_train(optimizer_fn, data, k * micro_batch,
                                      updates)
  assert not np.allclose(expected["dense/kernel"], unclipped["dense/kernel"],
                         rtol=1e-3), "clip_norm is too large to clip anything"
  _, actual = support.estimator_train(tmp_path, optimizer_fn, data,
                                      micro_batch, k, k * updates,
                                      clip_norm=clip_norm)
  support.assert_weights_close(actual, expected, what="clip_norm")


@pytest.mark.estimator
@pytest.mark.parametrize("bad_value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_window_is_skipped_whole(bad_value, control_flow, tmp_path,
                                            capfd):
  k, micro_batch, windows = 4, 4, 4
  window_size = k * micro_batch
  data = support.make_data(window_size * windows)
  bad_window = 1
  # One example in the third micro-batch of the second window.
  data["x"][bad_window * window_size + 2 * micro_batch + 1, 0] = bad_value
  clean = {key: np.delete(value, np.s_[bad_window * window_size:
                                       (bad_window + 1) * window_size], axis=0)
           for key, value in data.items()}
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  expected = support.reference_train(optimizer_fn, clean, window_size,
                                     windows - 1)

  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * windows,
      reportable_loss=True)
  assert "skipped the window ending at micro-batch 7" in capfd.readouterr().err
  support.assert_weights_moved(actual, "non-finite window")
  support.assert_weights_close(actual, expected, what="skipped window")
  value = estimator.get_variable_value
  assert value("global_step") == k * windows
  assert value("gradient_accumulation/skipped_windows") == 1
  assert value("gradient_accumulation/updates_applied") == windows - 1
  assert np.isfinite(value("dense/kernel/accum")).all()


@pytest.mark.estimator
def test_a_loss_reported_before_the_train_op_gives_one_line_per_window(
    tmp_path, capfd):
  # reportable_loss built first: the NaN micro-batch costs its window, and
  # the window's end is the one line that says so.
  k, micro_batch = 4, 4
  data = support.make_data(k * micro_batch * 3)
  data["x"][k * micro_batch + micro_batch + 1, 0] = np.nan  # micro-batch 5
  estimator, _ = support.estimator_train(
      tmp_path, lambda: v1.AdamOptimizer(0.05), data, micro_batch, k, k * 3,
      reportable_loss="first", log_every=None)
  lines = [line for line in capfd.readouterr().err.splitlines()
           if "estimator_accum" in line]
  assert len(lines) == 1 and (
      "skipped the window ending at micro-batch 7" in lines[0]), lines
  assert estimator.get_variable_value(
      "gradient_accumulation/skipped_windows") == 1


@pytest.mark.estimator
def test_nan_loss_without_reportable_loss_says_how_to_train_on(tmp_path,
                                                               capfd):
  # Estimator's own NanTensorHook stops on a NaN loss, whatever the train op
  # does with the window; the graph says so, at the micro-batch, and names
  # the way out (the test above takes it).
  k, micro_batch = 4, 4
  data = support.make_data(k * micro_batch * 2)
  data["x"][k * micro_batch + micro_batch + 1, 0] = np.nan  # micro-batch 5
  with pytest.raises(tf.compat.v1.train.NanLossDuringTrainingError):
    support.estimator_train(tmp_path, lambda: v1.AdamOptimizer(0.05), data,
                            micro_batch, k, k * 2)
  err = capfd.readouterr().err
  assert ("the loss of micro-batch 5 is NaN; its window will be skipped" in
          err), err[-2000:]
  assert "loss=estimator_accum.reportable_loss(loss)" in err
  assert "loss of micro-batch 4 " not in err


@pytest.mark.estimator
def test_restart_mid_window_loses_nothing(control_flow, tmp_path):
  k, micro_batch, updates = 4, 4, 3
  stop_at = k + 2  # two micro-batches into the second window
  data = support.make_data(k * micro_batch * updates)
  params = dict(optimizer_fn=lambda: v1.AdamOptimizer(0.05), k=k)

  uninterrupted = support.make_estimator(tmp_path / "once", params)
  uninterrupted.train(support.micro_batch_input_fn(data, micro_batch),
                      max_steps=k * updates)

  first = support.make_estimator(tmp_path / "twice", params)
  first.train(support.micro_batch_input_fn(data, micro_batch),
              max_steps=stop_at)
  assert np.any(first.get_variable_value("dense/kernel/accum") != 0)
  assert np.any(first.get_variable_value("embedding/accum_rows") != 0)
  # A new Estimator, as after a crash: it restores the checkpoint, window too.
  second = support.make_estimator(tmp_path / "twice", params)
  second.train(support.micro_batch_input_fn(data, micro_batch, skip=stop_at),
               max_steps=k * updates)

  for name in support.weight_names():
    np.testing.assert_allclose(
        second.get_variable_value(name),
        uninterrupted.get_variable_value(name), rtol=1e-6, atol=1e-7,
        err_msg=f"{name} after restart differs from the uninterrupted run")
  expected = support.reference_train(params["optimizer_fn"], data,
                                     k * micro_batch, updates)
  support.assert_weights_close(
      {n: second.get_variable_value(n) for n in support.weight_names()},
      expected, what="restart")


@pytest.mark.estimator
def test_resume_with_another_k_keeps_the_mean_with_num_examples(tmp_path):
  """What the README says of a resume that changes k mid-window: with
  num_examples the window in progress still gets its examples' mean.

  k=4 stops two micro-batches into the second window (global_step 6); k=2
  resumes, so that window ends at step 8 with 4 micro-batches (2 before the
  stop, 2 after), then windows of 2 follow. The big batches are the same
  groups of examples: 16, 16, 8, 8.
  """
  micro_batch, stop_at, total = 4, 6, 12
  data = support.make_data(micro_batch * total)
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  params = dict(optimizer_fn=optimizer_fn, weight_by_examples=True)
  first = support.make_estimator(tmp_path, dict(params, k=4))
  first.train(support.micro_batch_input_fn(data, micro_batch),
              max_steps=stop_at)
  second = support.make_estimator(tmp_path, dict(params, k=2))
  second.train(support.micro_batch_input_fn(data, micro_batch, skip=stop_at),
               max_steps=total)
  expected = support.reference_train(
      optimizer_fn, data, [16, 16, 8, 8], 4)
  support.assert_trained_like_big_batch(
      second, {n: second.get_variable_value(n) for n in support.weight_names()},
      expected, total, 4, "resume with k 4 -> 2 and num_examples")


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
@pytest.mark.parametrize("reduction", ["mean", "running_mean"])
def test_uneven_micro_batches_weighted_by_num_examples(optimizer_name,
                                                       reduction, tmp_path):
  """30 examples, micro-batch 4 (the last has 2), k=4 == batches 16 and 14."""
  optimizer_fn = {"sgd": lambda: v1.GradientDescentOptimizer(0.5),
                  "adam": lambda: v1.AdamOptimizer(0.05)}[optimizer_name]
  data = support.make_data(30)
  expected = support.reference_train(optimizer_fn, data, 16, 2)
  _, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, 4, 4, 8, weight_by_examples=True,
      reduction=reduction)
  support.assert_weights_close(actual, expected,
                               what=f"num_examples, {reduction}")

  # Without num_examples the short micro-batch counts as a full one: the
  # window is the plain mean of its four micro-batch means, not the big batch.
  _, unweighted = support.estimator_train(
      tmp_path / "unweighted", optimizer_fn, data, 4, 4, 8)
  assert not np.allclose(unweighted["dense/kernel"], expected["dense/kernel"],
                         rtol=1e-4)


@pytest.mark.estimator
def test_loss_over_tokens_weighted_by_token_counts(tmp_path):
  """A loss averaged over a micro-batch's real tokens (padding left out):
  num_examples = the micro-batch's token count makes each window the big
  batch's mean over all its tokens, however unevenly they fall."""
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  data = support.make_data(32)
  # 0 to 5 tokens an example: micro-batches of 4 hold 3 to 17 tokens.
  data["tokens"] = np.random.RandomState(3).randint(0, 6, 32).astype(np.int32)
  assert all(data["tokens"][i:i + 4].sum() > 0 for i in range(0, 32, 4))
  expected = support.reference_train(optimizer_fn, data, 16, 2,
                                     loss_reduction="tokens")
  _, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, 4, 4, 8, loss_reduction="tokens",
      weight_by_tokens=True)
  support.assert_weights_close(actual, expected, what="token counts")
  # Weighted by micro-batch instead, the window differs from the big batch.
  _, unweighted = support.estimator_train(
      tmp_path / "unweighted", optimizer_fn, data, 4, 4, 8,
      loss_reduction="tokens")
  assert not np.allclose(unweighted["dense/kernel"], expected["dense/kernel"],
                         rtol=1e-4)


@pytest.mark.estimator
def test_sum_reduction_equals_big_batch_with_summed_loss(tmp_path):
  optimizer_fn = lambda: v1.MomentumOptimizer(0.02, 0.9)  # noqa: E731
  data = support.make_data(48)
  expected = support.reference_train(optimizer_fn, data, 16, 3,
                                     loss_reduction="sum")
  _, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, 4, 4, 12, reduction="sum",
      loss_reduction="sum")
  support.assert_weights_close(actual, expected, what="sum reduction")


@pytest.mark.estimator
def test_running_mean_equals_mean(tmp_path):
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  data = support.make_data(48)
  _, mean = support.estimator_train(tmp_path / "mean", optimizer_fn, data, 4,
                                    4, 12)
  _, running = support.estimator_train(tmp_path / "running", optimizer_fn,
                                       data, 4, 4, 12, reduction="running_mean")
  support.assert_weights_close(running, mean, rtol=2e-6, what="running_mean")


def test_an_exported_meta_graph_imports_and_trains_on(control_flow, tmp_path):
  """import_meta_graph of a graph with the train op (the TF1 way to resume
  without the model's code): under control flow v2 the optimizer's apply op,
  which tf.compat.v1 optimizers add to TRAIN_OP, lives in the window's
  branch function, and a meta graph listing it could not be imported."""
  v1c = tf.compat.v1
  data = support.make_data(4 * 6)
  batches = [{key: value[4 * i:4 * (i + 1)] for key, value in data.items()}
             for i in range(6)]

  def feed(inputs, batch):
    return {inputs[key]: batch[key] for key in inputs}

  with tf.Graph().as_default():
    inputs = {key: v1c.placeholder(tf.as_dtype(value.dtype), value.shape,
                                   name=key)
              for key, value in batches[0].items()}
    loss = support.model_loss({k: v for k, v in inputs.items()
                               if k != "labels"}, inputs["labels"])
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.AdamOptimizer(0.05), 2, clip_norm=1.0,
        log_every_n_micro_batches=None)
    saver = v1c.train.Saver()
    with v1c.Session() as session:
      session.run(v1c.global_variables_initializer())
      for batch in batches[:3]:  # stopped mid-window
        session.run(train_op, feed(inputs, batch))
      saver.save(session, str(tmp_path / "model"))
      for batch in batches[3:]:
        session.run(train_op, feed(inputs, batch))
      expected = session.run({v.op.name: v
                              for v in v1c.trainable_variables()})

  with tf.Graph().as_default() as graph:
    saver = v1c.train.import_meta_graph(str(tmp_path / "model.meta"))
    (train_op,) = v1c.get_collection(v1c.GraphKeys.TRAIN_OP)
    inputs = {key: graph.get_tensor_by_name(key + ":0") for key in batches[0]}
    with v1c.Session() as session:
      saver.restore(session, str(tmp_path / "model"))
      for batch in batches[3:]:
        session.run(train_op, feed(inputs, batch))
      actual = session.run({v.op.name: v
                            for v in v1c.trainable_variables()})
  support.assert_weights_close(actual, expected, rtol=1e-6, atol=1e-7,
                               what="after import_meta_graph")
