"""Compact sparse accumulators: a table's window kept as the rows it touched.

- equal to big-batch training in a real Estimator for every optimizer;
- a 1,000,000 x 64 table: compact equals the dense path and its state holds
  exactly the rows the window touched;
- checkpointed mid-window; chosen by size ("auto"), by the user, refused
  where it cannot work.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.window.compact import CompactSparseAccumulator
from harness import support
from tests.integration.test_exact_optimizers import OPTIMIZERS

v1 = tf.compat.v1.train


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_compact_equals_big_batch(optimizer_name, tmp_path):
  optimizer_fn, uses_minimize = OPTIMIZERS[optimizer_name]
  k, micro_batch, updates = 4, 4, 3
  data = support.make_data(k * micro_batch * updates)
  expected = support.reference_train(optimizer_fn, data, k * micro_batch,
                                     updates, minimize=uses_minimize)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * updates,
      sparse_accumulation=True)
  names = estimator.get_variable_names()
  assert "embedding/accum_values" in names
  assert "embedding/accum" not in names  # no dense copy of the table
  support.assert_trained_like_big_batch(
      estimator, actual, expected, k * updates, updates,
      f"compact {optimizer_name}")


@pytest.mark.estimator
def test_compact_with_examples_weights_and_running_mean(control_flow,
                                                        tmp_path):
  """Uneven micro-batches (30 examples, micro-batch 4, k=4) == 16 + 14."""
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  data = support.make_data(30)
  expected = support.reference_train(optimizer_fn, data, 16, 2)
  for reduction in ("mean", "running_mean"):
    _, actual = support.estimator_train(
        tmp_path / reduction, optimizer_fn, data, 4, 4, 8,
        weight_by_examples=True, reduction=reduction,
        sparse_accumulation=["embedding"])
    support.assert_weights_close(actual, expected,
                                 what=f"compact, {reduction}, {control_flow}")


@pytest.mark.estimator
def test_compact_window_survives_a_restart(control_flow, tmp_path):
  k, micro_batch, updates = 4, 4, 3
  stop_at = k + 2
  data = support.make_data(k * micro_batch * updates)
  params = dict(optimizer_fn=lambda: v1.MomentumOptimizer(0.2, 0.9), k=k,
                sparse_accumulation=True)
  first = support.make_estimator(tmp_path, params)
  first.train(support.micro_batch_input_fn(data, micro_batch),
              max_steps=stop_at)
  touched = np.unique(data["ids"][k * micro_batch:stop_at * micro_batch])
  saved = first.get_variable_value("embedding/accum_indices")
  assert sorted(saved) == sorted(touched)  # the window, in the checkpoint
  second = support.make_estimator(tmp_path, params)
  second.train(support.micro_batch_input_fn(data, micro_batch, skip=stop_at),
               max_steps=k * updates)
  expected = support.reference_train(params["optimizer_fn"], data,
                                     k * micro_batch, updates)
  support.assert_weights_close(
      {n: second.get_variable_value(n) for n in support.weight_names()},
      expected, what="compact, restarted mid-window")


def test_nan_window_is_skipped_with_compact_accumulators(tmp_path):
  """A NaN in the table's gradient skips the window and empties the state."""
  k = 2
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable(
        "table", initializer=tf.ones([10, 3]), use_resource=True)
    scale = tf.compat.v1.placeholder(tf.float32, [])
    ids = tf.constant([1, 4, 4])
    loss = tf.reduce_sum(tf.gather(table, ids)) * scale
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.GradientDescentOptimizer(1.0), k, sparse_accumulation=True,
        summaries=False)
    state = estimator_accum.get_accumulation_state()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op, {scale: np.nan})
      session.run(train_op, {scale: 1.0})
      np.testing.assert_array_equal(session.run(table), np.ones([10, 3]))
      assert session.run(state.skipped_windows) == 1
      assert session.run(state.accumulators[0].indices).size == 0
      session.run(train_op, {scale: 1.0})
      session.run(train_op, {scale: 1.0})
      expected = np.ones([10, 3])
      expected[1] -= 1.0
      expected[4] -= 2.0
      np.testing.assert_allclose(session.run(table), expected, rtol=1e-6)


ROWS, DIM, K, IDS_PER_MICRO_BATCH = 1_000_000, 64, 4, 2048


def _huge_table():
  """The 1,000,000 x 64 table, the same initial values in every graph."""
  tf.compat.v1.set_random_seed(0)
  return tf.compat.v1.get_variable(
      "table", [ROWS, DIM], use_resource=True,
      initializer=tf.compat.v1.random_normal_initializer(stddev=0.1, seed=1))


def _train_huge_table(sparse_accumulation, windows=2):
  """A 1,000,000 x 64 table, k=4; returns (table, [rows held per step])."""
  graph = tf.Graph()
  with graph.as_default():
    table = _huge_table()
    head = tf.compat.v1.get_variable(
        "head", [DIM, 1], use_resource=True,
        initializer=tf.compat.v1.random_normal_initializer(seed=2))
    ids = tf.compat.v1.placeholder(tf.int64, [IDS_PER_MICRO_BATCH])
    rows = tf.gather(table, ids)
    loss = tf.reduce_mean(tf.square(tf.matmul(rows, head) - 1.0))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.AdamOptimizer(0.01), K,
        sparse_accumulation=sparse_accumulation, summaries=False)
    accumulator = estimator_accum.get_accumulation_state().accumulators[0]
    assert accumulator.variable is table
    rng = np.random.RandomState(0)
    held = []
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(windows * K):
        # Repeats within and across micro-batches: ids from 5,000 rows.
        batch = rng.randint(0, 5_000, IDS_PER_MICRO_BATCH)
        session.run(train_op, {ids: batch})
        if accumulator.is_compact:
          held.append((session.run(accumulator.indices),
                       session.run(accumulator.values).nbytes))
      return session.run(table), held


@pytest.mark.slow  # a table of a million rows, trained twice
def test_huge_table_compact_equals_dense_and_holds_rows_touched():
  compact, held = _train_huge_table(True)
  dense, _ = _train_huge_table(False)
  moved = np.any(compact != _initial_table_rows(compact), axis=1)
  assert 1_000 < moved.sum() <= 5_000  # only touched rows move
  np.testing.assert_allclose(compact, dense, rtol=1e-5, atol=1e-7)

  rng = np.random.RandomState(0)
  seen = set()
  for step, (indices, values_bytes) in enumerate(held):
    batch = rng.randint(0, 5_000, IDS_PER_MICRO_BATCH)
    if step % K == K - 1:  # the window ended: applied and emptied
      assert indices.size == 0 and values_bytes == 0
      seen = set()
      continue
    seen |= set(batch.tolist())
    assert sorted(indices.tolist()) == sorted(seen)
    assert values_bytes == len(seen) * DIM * 4


def _initial_table_rows(trained):
  graph = tf.Graph()
  with graph.as_default():
    table = _huge_table()
    with tf.compat.v1.Session() as session:
      session.run(table.initializer)
      start = session.run(table)
  assert start.shape == trained.shape
  return start


def _build(sparse_accumulation="auto", **kwargs):
  """Builds a graph with a 1000 x 8 table and a dense layer; returns the
  accumulators by variable name."""
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable("table", [1000, 8], use_resource=True)
    small = tf.compat.v1.get_variable("small", [10, 8], use_resource=True)
    dense = tf.compat.v1.get_variable("dense", [8, 1], use_resource=True)
    rows = tf.gather(table, [1, 2]) + tf.gather(small, [3, 3])
    loss = tf.reduce_mean(tf.matmul(rows, dense))
    estimator_accum.build_accumulating_train_op(
        loss, v1.GradientDescentOptimizer(0.1), 2,
        sparse_accumulation=sparse_accumulation, **kwargs)
    state = estimator_accum.get_accumulation_state()
    return {a.variable.op.name: a for a in state.accumulators}


def test_auto_chooses_compact_above_the_threshold():
  accumulators = _build(sparse_threshold_bytes=1000 * 8 * 4)
  assert isinstance(accumulators["table"], CompactSparseAccumulator)
  assert not accumulators["small"].is_compact  # 320 bytes < threshold
  assert accumulators["small"].is_sparse
  assert not accumulators["dense"].is_compact
  # The default threshold, 128 MB, keeps small tables dense.
  assert not any(a.is_compact for a in _build().values())


def test_user_chooses_compact_per_variable():
  by_name = _build(["small"])
  assert by_name["small"].is_compact and not by_name["table"].is_compact
  assert not any(a.is_compact for a in _build(False).values())
  every = _build(True)
  assert every["table"].is_compact and every["small"].is_compact
  assert not every["dense"].is_compact


@pytest.mark.parametrize("value, error, message", [
    ("always", ValueError, "sparse_accumulation must be 'auto'"),
    (["nope"], ValueError, "names ['nope']"),
    (["dense"], ValueError, "names ['dense'], whose gradients are dense"),
    ([3], TypeError, "got 3 in it"),
    (3, TypeError, "sparse_accumulation must be"),
])
def test_bad_sparse_accumulation_is_named(value, error, message):
  with pytest.raises(error, match=None) as caught:
    _build(value)
  assert message in str(caught.value)


@pytest.mark.parametrize("value, error", [(-1, ValueError), (1.5, TypeError),
                                          (True, TypeError)])
def test_bad_threshold_is_named(value, error):
  with pytest.raises(error, match="sparse_threshold_bytes"):
    _build(sparse_threshold_bytes=value)


def _build_mirrored(sparse_accumulation):
  graph = tf.Graph()
  with graph.as_default():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
      table = tf.compat.v1.get_variable("table", [1000, 8], use_resource=True)

    def step():
      loss = tf.reduce_sum(tf.gather(table, [1, 2]))
      return estimator_accum.build_accumulating_train_op(
          loss, v1.GradientDescentOptimizer(0.1), 2,
          sparse_accumulation=sparse_accumulation, sparse_threshold_bytes=0)

    strategy.extended.call_for_each_replica(step)
    return estimator_accum.get_accumulation_state(graph).accumulators


def test_several_replicas_accumulate_densely_or_refuse():
  (accumulator,) = _build_mirrored("auto")
  assert accumulator.is_sparse and not accumulator.is_compact
  with pytest.raises(ValueError, match="need one replica; this strategy has 2"):
    _build_mirrored(True)


def test_build_logs_compact_tables(caplog):
  with caplog.at_level(logging.INFO):
    _build(["table"])
  lines = [record.getMessage() for record in caplog.records]
  (line,) = [line for line in lines if "accumulated compactly" in line]
  assert "table 40 bytes per row touched, 0.0 MB dense" in line
