"""sequential_apply: the window's end applies one variable at a time (each
variable's own update ops wait for the previous variable's updates), and
leaves the apply as it is where one update reads several gradients."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.window import apply_order
from harness import support

WIDTHS = [6, 5, 4, 3]


def _build(optimizer, sequential_apply):
  x = tf.constant(np.random.RandomState(0).randn(8, WIDTHS[0]), tf.float32)
  h = x
  for index, (width_in, width_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
    kernel = tf.compat.v1.get_variable(
        f"kernel_{index}", initializer=tf.constant(
            np.random.RandomState(index).randn(width_in, width_out) * 0.5,
            tf.float32))
    h = tf.tanh(tf.matmul(h, kernel))
  tf.compat.v1.train.get_or_create_global_step()
  return estimator_accum.build_accumulating_train_op(
      tf.reduce_sum(tf.square(h)), optimizer, 2, clip_norm=1.0,
      sequential_apply=sequential_apply, log_every_n_micro_batches=None)


def _train(optimizer_fn, sequential_apply, control_flow_v2=True):
  graph = tf.Graph()
  with graph.as_default():
    train_op = _build(optimizer_fn(), sequential_apply)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(train_op)
      return session.run({v.op.name: v
                          for v in tf.compat.v1.trainable_variables()})


@pytest.mark.parametrize("optimizer_fn", [
    lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    lambda: tf.keras.optimizers.legacy.Adam(0.1, global_clipnorm=0.5),
], ids=["adam", "keras_global_clipnorm"])
def test_the_same_weights_either_way(optimizer_fn, control_flow):
  ordered = _train(optimizer_fn, True)
  unordered = _train(optimizer_fn, False)
  for name in unordered:
    np.testing.assert_allclose(ordered[name], unordered[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def _spy_on_chain(monkeypatch):
  calls = []
  real = apply_order.chain

  def spy(gates, made):
    result = real(gates, made)
    calls.append((gates, result))
    return result

  monkeypatch.setattr(apply_order, "chain", spy)
  return calls


def test_each_update_waits_for_the_previous_ones(monkeypatch):
  calls = _spy_on_chain(monkeypatch)
  with tf.Graph().as_default():
    _build(tf.compat.v1.train.AdamOptimizer(0.1), True)
  ((gates, ordered),) = calls
  assert ordered and len(gates) == 3
  updates = [apply_order._updates_fed_by(g) for g in gates]  # noqa: SLF001
  assert all(updates)
  for earlier, later in zip(updates, updates[1:]):
    # Every op of the later variable's update, its slots' reads included,
    # comes after the earlier variable's updates.
    for op in later:
      assert support.depends_on(op, earlier), op.name
    reads = [t.op for op in later for t in op.inputs
             if t.op.type == "ReadVariableOp"]
    assert reads and all(support.depends_on(r, earlier) for r in reads)


def test_an_update_reading_every_gradient_is_left_unordered(monkeypatch):
  calls = _spy_on_chain(monkeypatch)
  with tf.Graph().as_default():
    _build(tf.keras.optimizers.legacy.Adam(0.1, global_clipnorm=0.5), True)
  ((gates, ordered),) = calls
  assert not ordered
  assert not any(g.control_inputs for g in gates)
