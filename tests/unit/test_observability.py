"""Public API pin, TensorBoard scalars, the progress line and update_count."""

import glob
import logging
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support


def _scalars(model_dir):
  values = {}
  for path in glob.glob(str(model_dir / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        values.setdefault(value.tag, []).append((event.step,
                                                 value.simple_value))
  return values


@pytest.mark.estimator
def test_tensorboard_scalars_and_progress_line(tmp_path, caplog):
  k, micro_batch = 2, 4
  data = support.make_data(k * micro_batch * 4)
  hook = estimator_accum.AccumulationLoggingHook(
      every_n_micro_batches=2, micro_batch_size=micro_batch)
  config = tf.estimator.RunConfig(model_dir=str(tmp_path),
                                  save_summary_steps=1,
                                  log_step_count_steps=1_000_000)
  estimator = tf.estimator.Estimator(
      support.accumulating_model_fn, config=config,
      params=dict(optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01),
                  k=k, training_hooks=[hook]))
  with caplog.at_level(logging.INFO, logger="absl"):
    estimator.train(support.micro_batch_input_fn(data, micro_batch),
                    max_steps=8)

  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("micro-batch")]
  assert lines[-1].startswith("micro-batch 8 | update 4 (k=2) | skipped "
                              "windows 0 |"), lines
  assert "examples/sec" in lines[-1]

  scalars = _scalars(tmp_path)
  updates = dict(scalars["accumulation/updates_applied"])
  assert updates[8] == 4, updates
  assert dict(scalars["accumulation/skipped_windows"])[8] == 0
  norms = dict(scalars["accumulation/applied_gradient_norm"])
  assert norms[8] > 0 and np.isfinite(norms[8])


def _train_step_fetch_sets(monkeypatch):
  """Records, for every session call that runs a train op, its set of
  fetched tensors and target ops: what TensorFlow keys an executor by."""
  seen = []
  do_run = tf.compat.v1.Session._do_run

  def recording(session, handle, targets, fetches, *args, **kwargs):
    names = frozenset([op.name for op in targets] +
                      [t.name for t in fetches])
    if any("train_op" in name for name in names):
      seen.append(names)
    return do_run(session, handle, targets, fetches, *args, **kwargs)

  monkeypatch.setattr(tf.compat.v1.Session, "_do_run", recording)
  return seen


def _train_with_summaries(tmp_path, monkeypatch, every_step):
  k, micro_batch, steps = 2, 4, 10
  data = support.make_data(k * micro_batch * 5)
  hooks = [estimator_accum.AccumulationLoggingHook(
      every_n_micro_batches=2, micro_batch_size=micro_batch)]
  if every_step:
    hooks.append(estimator_accum.EveryStepSummaryHook(str(tmp_path), 4))
  config = tf.estimator.RunConfig(
      model_dir=str(tmp_path), save_summary_steps=None if every_step else 4,
      log_step_count_steps=None if every_step else 100)
  estimator = tf.estimator.Estimator(
      support.accumulating_model_fn, config=config,
      params=dict(optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01),
                  k=k, training_hooks=hooks))
  seen = _train_step_fetch_sets(monkeypatch)
  estimator.train(support.micro_batch_input_fn(data, micro_batch),
                  max_steps=steps)
  assert len(seen) == steps
  return set(seen), _scalars(tmp_path)


@pytest.mark.estimator
def test_every_step_summaries_run_one_executor(tmp_path, monkeypatch):
  # Estimator's own hooks fetch the summaries (and the logged loss) on some
  # steps only: each new set of fetches is one more executor.
  theirs, their_scalars = _train_with_summaries(tmp_path / "estimator",
                                                monkeypatch, False)
  assert len(theirs) > 1
  ours, scalars = _train_with_summaries(tmp_path / "hook", monkeypatch, True)
  assert len(ours) == 1, ours
  # Written on the first step and every 4th, as Estimator writes them.
  updates = dict(scalars["accumulation/updates_applied"])
  assert sorted(updates) == [1, 4, 8], updates
  assert updates[4] == 2 and updates[8] == 4
  assert sorted(dict(scalars["loss"])) == [1, 4, 8]
  assert set(scalars) == set(their_scalars)


@pytest.mark.parametrize("save_steps", [0, -1, 2.5, True, None])
def test_every_step_summary_hook_refuses_bad_steps(save_steps):
  with pytest.raises(ValueError, match=rf"save_steps must be an int >= 1, "
                     rf"got {re.escape(repr(save_steps))}"):
    estimator_accum.EveryStepSummaryHook("/tmp", save_steps)


def test_every_step_summary_hook_refuses_no_directory():
  with pytest.raises(ValueError, match="output_dir must be a directory, "
                     "got ''"):
    estimator_accum.EveryStepSummaryHook("", 10)


def _progress_rates(caplog):
  """(micro-batches/sec, examples/sec) of every progress line, each as
  (value, half a unit of its last printed digit): the rounding's bound."""
  rates = []
  for record in caplog.records:
    found = re.search(r"([\d.]+) micro-batches/sec \| ([\d.]+) examples/sec",
                      record.getMessage())
    if found:
      rates.append(tuple((float(text), 0.5 * 10.0**-len(text.split(".")[1]))
                         for text in found.groups()))
  return rates


@pytest.mark.estimator
@pytest.mark.parametrize("counted_from", ["input", "num_examples", "mirrored"])
def test_progress_line_counts_the_examples_it_runs(counted_from, tmp_path,
                                                   caplog):
  """Without micro_batch_size, examples/sec counts the micro-batches' real
  sizes: 30 examples in micro-batches of 4 end with one of 2, and under
  MirroredStrategy every step runs one micro-batch per replica."""
  strategy = None
  params = dict(optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01),
                k=2, training_hooks=[estimator_accum.AccumulationLoggingHook(
                    every_n_micro_batches=2)])
  if counted_from == "num_examples":
    params["weight_by_examples"] = True
  replicas = 1
  if counted_from == "mirrored":
    strategy, replicas = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), 2
  estimator = support.make_estimator(tmp_path, params,
                                     train_distribute=strategy)
  with caplog.at_level(logging.INFO, logger="absl"):
    estimator.train(support.micro_batch_input_fn(support.make_data(30), 4))
  # Examples per micro-batch step over each line's two steps.
  expected = [8.0, 8.0, 8.0, 6.0] if replicas == 1 else [16.0, 14.0]
  rates = _progress_rates(caplog)
  assert len(rates) == len(expected), rates
  for ((micro_batches, mb_half), (examples, ex_half)), per_step in zip(
      rates, expected):
    # Both rates divide by the same time: examples/sec is exactly the
    # examples per step times micro-batches/sec, up to their printed digits.
    per_micro_batch = per_step / 2
    assert abs(examples - per_micro_batch * micro_batches) <= (
        ex_half + per_micro_batch * mb_half + 1e-9), (rates, expected)


@pytest.mark.estimator
@pytest.mark.parametrize("replicas", [1, 2])
def test_the_train_op_logs_progress_with_no_hook(replicas, tmp_path, caplog):
  """The first micro-batch, the end of the first window, then every
  log_every_n_micro_batches, written by the graph itself; seen with TensorFlow's logger at INFO and absl's not (a
  script with tf.compat.v1.logging.set_verbosity(INFO) and no app.run)."""
  strategy = None
  if replicas == 2:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  estimator = support.make_estimator(tmp_path, dict(
      optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01), k=2,
      log_every=3), train_distribute=strategy)
  assert not logging.getLogger("absl").isEnabledFor(logging.INFO)
  with caplog.at_level(logging.INFO, logger="tensorflow"):
    estimator.train(support.micro_batch_input_fn(support.make_data(48), 4),
                    max_steps=7)
  lines = [r.getMessage() for r in caplog.records
           if r.name == "tensorflow" and r.getMessage().startswith(
               "micro-batch")]
  assert [line.split(" | ")[:3] for line in lines] == [
      ["micro-batch 1", "update 0 (k=2)", "skipped windows 0"],
      ["micro-batch 2", "update 1 (k=2)", "skipped windows 0"],
      ["micro-batch 3", "update 1 (k=2)", "skipped windows 0"],
      ["micro-batch 6", "update 3 (k=2)", "skipped windows 0"]], lines
  assert "micro-batches/sec" not in lines[0]
  rates = _progress_rates(caplog)
  assert len(rates) == 3, lines
  for (micro_batches, mb_half), (examples, ex_half) in rates:
    per_micro_batch = 4 * replicas  # every replica's examples
    assert abs(examples - per_micro_batch * micro_batches) <= (
        ex_half + per_micro_batch * mb_half + 1e-9), lines


@pytest.mark.estimator
def test_the_hook_replaces_the_train_ops_line(tmp_path, caplog):
  hook = estimator_accum.AccumulationLoggingHook(every_n_micro_batches=4,
                                                 total_micro_batches=8)
  estimator = support.make_estimator(tmp_path, dict(
      optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01), k=2,
      log_every=1, training_hooks=[hook]))
  with caplog.at_level(logging.INFO):
    estimator.train(support.micro_batch_input_fn(support.make_data(32), 4),
                    max_steps=8)
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("micro-batch")]
  assert [line.split(" | ")[0] for line in lines] == [
      "micro-batch 4/8 (50%)", "micro-batch 8/8 (100%)"], lines


@pytest.mark.estimator
def test_no_progress_line_when_asked(tmp_path, caplog):
  estimator = support.make_estimator(tmp_path, dict(
      optimizer_fn=lambda: tf.compat.v1.train.AdamOptimizer(0.01), k=2,
      log_every=None))
  with caplog.at_level(logging.INFO):
    estimator.train(support.micro_batch_input_fn(support.make_data(16), 4),
                    max_steps=4)
  assert not [r for r in caplog.records
              if r.getMessage().startswith("micro-batch")]


def _placeholder_train_op():
  """(x, train_op): k=2 on a loss fed through a placeholder of 3 features."""
  x = tf.compat.v1.placeholder(tf.float32, [None, 3])
  w = tf.compat.v1.get_variable("w", [3, 1])
  return x, estimator_accum.build_accumulating_train_op(
      tf.reduce_mean(tf.matmul(x, w)),
      tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)


def test_progress_line_says_when_it_cannot_count_examples(caplog):
  """A loss fed through placeholders has no input_fn batch to count."""
  with tf.Graph().as_default():
    x, train_op = _placeholder_train_op()
    hook = estimator_accum.AccumulationLoggingHook(every_n_micro_batches=2)
    with caplog.at_level(logging.INFO, logger="absl"):
      with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        for _ in range(4):
          session.run(train_op, {x: np.ones((5, 3), np.float32)})
  messages = [r.getMessage() for r in caplog.records]
  assert any("examples cannot be counted" in m and "micro_batch_size=" in m
             for m in messages), messages
  lines = [m for m in messages if m.startswith("micro-batch")]
  assert len(lines) == 2 and not any("examples/sec" in m for m in lines)


def test_update_count_follows_windows():
  graph = tf.Graph()
  with graph.as_default():
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    count = estimator_accum.update_count(3)
    # A learning rate on the update count, read inside the apply branch.
    learning_rate = 0.1 * tf.cast(count + 1, tf.float32)
    train_op = estimator_accum.build_accumulating_train_op(
        w * 1.0, tf.compat.v1.train.GradientDescentOptimizer(learning_rate), 3)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      seen = []
      for _ in range(9):
        seen.append(session.run(count))
        session.run(train_op)
      assert seen == [0, 0, 0, 1, 1, 1, 2, 2, 2]
      # Updates used learning rates 0.1, 0.2, 0.3 on a gradient of 1.
      np.testing.assert_allclose(session.run(w), 1.0 - 0.6, rtol=1e-6)


def test_accumulator_memory_is_logged_at_start(caplog):
  with tf.Graph().as_default(), caplog.at_level(logging.INFO, logger="absl"):
    features = {key: tf.constant(value)
                for key, value in support.make_data(4).items()}
    loss = support.model_loss(features, features["labels"])
    estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), 4)
  trained = sum(value.size * 4 for value in support.initial_weights().values())
  rows = support.VOCAB * 4  # One float32 per embedding row.
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("gradient accumulation: k=4")]
  assert len(lines) == 1
  assert (f"accumulators take {(trained + rows) / 2**20:.1f} MB" in lines[0]
          and "over 5 variables" in lines[0]), lines[0]


def test_the_window_cost_line_weighs_each_step_by_its_work(caplog,
                                                          monkeypatch):
  """With `work` (a micro-batch's token positions), the hook hands the
  window cost each step's work with its time and says the line."""
  from estimator_accum.planning import window_cost  # noqa: PLC0415
  seen = []
  real = window_cost.measure

  def spy(step_seconds, k, first_position, **kwargs):
    seen.append(kwargs.get("work"))
    return real(step_seconds, k, first_position, **kwargs)

  monkeypatch.setattr(window_cost, "measure", spy)
  with tf.Graph().as_default():
    x, train_op = _placeholder_train_op()
    hook = estimator_accum.AccumulationLoggingHook(
        every_n_micro_batches=100, micro_batch_size=5, work=tf.size(x))
    rows = [2, 3] * 8  # each window: a short micro-batch, then a long one
    with caplog.at_level(logging.INFO, logger="absl"):
      with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        for count in rows:
          session.run(train_op, {x: np.ones((count, 3), np.float32)})
  assert seen == [[3 * count for count in rows[:len(seen[0])]]], seen
  assert any(r.getMessage().startswith("window cost: 2 micro-batches")
             for r in caplog.records)
