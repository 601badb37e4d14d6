"""sequential_apply: the window's end applies one variable at a time (each
variable's own update ops wait for the previous variable's updates), and
leaves the apply as it is where one update reads several gradients."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.window import apply_order
from harness import support
from tests.helpers import tanh_stack


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer_fn", [
    lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    lambda: tf.keras.optimizers.legacy.Adam(0.1, global_clipnorm=0.5),
], ids=["adam", "keras_global_clipnorm"])
def test_the_same_weights_either_way(optimizer_fn, control_flow):
  ordered = tanh_stack.trained_weights(optimizer_fn, sequential_apply=True)
  unordered = tanh_stack.trained_weights(optimizer_fn,
                                         sequential_apply=False)
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
    tanh_stack.train_op(tf.compat.v1.train.AdamOptimizer(0.1),
                        sequential_apply=True)
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


@pytest.mark.keras2
def test_an_update_reading_every_gradient_is_left_unordered(monkeypatch):
  calls = _spy_on_chain(monkeypatch)
  with tf.Graph().as_default():
    tanh_stack.train_op(
        tf.keras.optimizers.legacy.Adam(0.1, global_clipnorm=0.5),
        sequential_apply=True)
  ((gates, ordered),) = calls
  assert not ordered
  assert not any(g.control_inputs for g in gates)
