"""WindowTraceHook: one window's micro-batches traced after the windows it
skips, its time put in categories, a Chrome trace written."""

import json

import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.integrations import window_trace
from harness import support

K, B = 2, 4


def _train(hook, steps):
  """Runs `steps` micro-batches of the support model (k=K) with `hook`."""
  data = support.make_data(B * steps)
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(B).repeat()
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    loss = support.model_loss(batch, batch["labels"])
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(0.01), K, summaries=False,
        log_every_n_micro_batches=None)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as run:
      for _ in range(steps):
        run.run(train_op)


def test_one_window_after_the_skipped_ones_is_traced(tmp_path):
  hook = estimator_accum.WindowTraceHook(str(tmp_path), skip_windows=2)
  _train(hook, 4 * K)
  summary = hook.summary
  assert summary is not None
  # Its ops' time, all of it in categories; a matmul model spends on matmuls.
  assert summary["thread_ms"] > 0
  assert sum(summary["categories"].values()) == pytest.approx(
      summary["thread_ms"])
  assert summary["categories"]["matmuls"] > 0
  assert summary["busy_ms"] <= summary["wall_ms"] + 1e-6
  assert summary["busy_ms"] <= summary["thread_ms"] + 1e-6
  assert "MatMul" in "".join(summary["ops"])
  trace = json.loads((tmp_path / "window_trace.json").read_text())
  steps = {event["pid"] for event in trace["traceEvents"]}
  assert steps == set(range(K)), "one trace per micro-batch of the window"
  assert all(event["dur"] >= 1 for event in trace["traceEvents"])
  line = window_trace.describe(summary, K, 12.0)
  assert line.startswith(f"window trace: the window before, untraced: {K} "
                         "micro-batches in 12 ms; traced: ")


def test_a_run_that_ends_before_the_window_traces_nothing(tmp_path):
  hook = estimator_accum.WindowTraceHook(str(tmp_path), skip_windows=3)
  _train(hook, 3 * K)
  assert hook.summary is None
  assert not (tmp_path / "window_trace.json").exists()


@pytest.mark.parametrize("op_type, category", [
    ("_MklMatMul", "matmuls"), ("BatchMatMulV2", "matmuls"),
    ("GatherNd", "gathers and scatters"), ("_MklSoftmax", "softmax"),
    ("StatefulPartitionedCall", "the window's end (compiled)"),
    ("RandomUniform", "random numbers (dropout)"),
    ("AssignAddVariableOp", "variables (reads, accumulator adds, apply)"),
    ("Reshape", "shapes, copies, control flow"), ("Erf", "element-wise")])
def test_op_types_fall_in_their_category(op_type, category):
  assert window_trace.category_of(op_type) == category


@pytest.mark.parametrize("arguments, named", [
    (dict(output_dir=""), "output_dir"), (dict(output_dir=3), "output_dir"),
    (dict(output_dir="x", skip_windows=-1), "skip_windows"),
    (dict(output_dir="x", skip_windows=True), "skip_windows")])
def test_bad_arguments_are_named(arguments, named):
  with pytest.raises(ValueError, match=named):
    estimator_accum.WindowTraceHook(**arguments)
