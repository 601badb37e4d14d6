"""fused_apply: XLA compiles each variable's update at the window's end into
one loop of its own; the weights are the unfused update's up to float32
rounding, and the end's peak memory is not above the unfused one's."""

import numpy as np
import pytest
import tensorflow as tf

from models.bert import optimization
from tests.helpers import tanh_stack

# XLA's marks and the window end's peak, on the graph Grappler makes.
pytestmark = pytest.mark.grappler

OPTIMIZERS = {
    "google_adam_weight_decay": lambda: optimization.make_optimizer(
        "adamw", 0.05),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "keras_adam": lambda: tf.keras.optimizers.legacy.Adam(0.1),
}


def _build(optimizer, fused_apply, **options):
  return tanh_stack.train_op(optimizer, fused_apply=fused_apply, **options)


def _train(optimizer_fn, fused_apply, sequential_apply=True):
  return tanh_stack.trained_weights(optimizer_fn, fused_apply=fused_apply,
                                    sequential_apply=sequential_apply)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_same_weights_fused_or_not(optimizer, control_flow):
  fused = _train(OPTIMIZERS[optimizer], True)
  plain = _train(OPTIMIZERS[optimizer], False)
  unordered = _train(OPTIMIZERS[optimizer], False, sequential_apply=False)
  for name in plain:
    start = tanh_stack.initial_kernel(int(name[-1]), *plain[name].shape)
    assert not np.allclose(plain[name], start), name  # it trained
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)
    np.testing.assert_allclose(unordered[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def test_fused_without_sequential_apply_is_exact_too():
  fused = _train(OPTIMIZERS["adam"], True, sequential_apply=False)
  plain = _train(OPTIMIZERS["adam"], False, sequential_apply=False)
  for name in plain:
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def _xla_runs(fused_apply):
  """The names of the XLA clusters an applying micro-batch ran."""
  with tf.Graph().as_default():
    train_op = _build(OPTIMIZERS["google_adam_weight_decay"](), fused_apply)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)  # accumulates
      metadata = tf.compat.v1.RunMetadata()
      session.run(train_op, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=metadata)
  return sorted({node.node_name.split("/")[0]
                 for device in metadata.step_stats.dev_stats
                 for node in device.node_stats
                 if "_XlaRun" in node.node_name or
                 node.node_name.startswith("cluster_")})


def test_each_variable_is_one_compiled_loop():
  clusters = _xla_runs(True)
  # One cluster per variable: three kernels, each its own XLA scope.
  assert len(clusters) == len(tanh_stack.WIDTHS) - 1, clusters
  assert _xla_runs(False) == []


def test_each_variables_ops_carry_a_scope_of_their_own():
  with tf.Graph().as_default() as graph:
    _build(OPTIMIZERS["adam"](), True)
    scopes = {}
    for function in [graph, *graph._functions.values()]:  # noqa: SLF001
      operations = (function.get_operations() if function is graph else
                    function.graph.get_operations())
      for op in operations:
        try:
          scope = op.get_attr("_XlaScope").decode()
        except ValueError:
          continue
        scopes.setdefault(scope, set()).add(op.type)
  assert len(scopes) == len(tanh_stack.WIDTHS) - 1, sorted(scopes)
  for types in scopes.values():
    assert "AssignVariableOp" in types or "ResourceApplyAdam" in types, types


@pytest.mark.parametrize("value", [1, "yes", None])
def test_fused_apply_that_is_not_a_bool(value):
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match=rf"fused_apply .*{value!r}"):
      _build(OPTIMIZERS["adam"](), value)


@pytest.mark.memory
def test_the_ends_peak_is_not_above_the_unfused_one():
  """Four 1M-parameter variables, AdamWeightDecay: the applying
  micro-batch's peak tensor memory (BFC allocator) with fused_apply is at
  most the unfused one's."""
  peaks = {}
  for fused in (False, True):
    with tf.Graph().as_default():
      train_op = _build(OPTIMIZERS["google_adam_weight_decay"](), fused,
                        widths=[1000] * 5,
                        rows=4)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          session.run(train_op)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        session.run(train_op)
        peaks[fused] = (tf.config.experimental.get_memory_info("CPU:0")[
            "peak"] - before)
  assert peaks[False] > 4 * 2**20, peaks  # a variable's temporaries at least
  assert peaks[True] <= peaks[False], peaks
