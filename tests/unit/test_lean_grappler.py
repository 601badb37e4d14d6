"""estimator_accum.lean_grappler: a session config whose Grappler skips
TFG's pipeline and, on a CPU, the memory and layout optimizers. What it
keeps is the user's; where a GPU is seen it changes nothing; the graph a
session runs is TensorFlow's full Grappler's (but for how two constants
reach a branch), and the weights it trains to are the same to the bit."""

import collections

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import estimator_accum

REWRITER = rewriter_config_pb2.RewriterConfig


def test_none_is_estimators_default_without_the_idle_passes():
  config = estimator_accum.lean_grappler(gpu=False)
  options = config.graph_options.rewrite_options
  assert config.allow_soft_placement
  assert options.meta_optimizer_iterations == REWRITER.ONE
  assert options.disable_tfg_optimizer
  assert options.memory_optimization == REWRITER.NO_MEM_OPT
  assert options.layout_optimizer == REWRITER.OFF
  # Every other pass as TensorFlow decides.
  for toggle in ("remapping", "constant_folding", "arithmetic_optimization",
                 "dependency_optimization", "function_optimization"):
    assert getattr(options, toggle) == REWRITER.DEFAULT, toggle
  assert not options.disable_meta_optimizer


def test_the_users_config_is_kept_and_not_changed():
  given = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3,
                                   device_count={"CPU": 2})
  given.graph_options.rewrite_options.memory_optimization = REWRITER.MANUAL
  given.graph_options.rewrite_options.layout_optimizer = REWRITER.ON
  before = given.SerializeToString()
  config = estimator_accum.lean_grappler(given, gpu=False)
  assert given.SerializeToString() == before
  assert config.intra_op_parallelism_threads == 3
  assert config.device_count["CPU"] == 2
  assert not config.allow_soft_placement  # not the user's
  options = config.graph_options.rewrite_options
  assert options.memory_optimization == REWRITER.MANUAL
  assert options.layout_optimizer == REWRITER.ON
  assert options.disable_tfg_optimizer


def test_where_a_gpu_is_seen_nothing_changes():
  given = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3)
  assert estimator_accum.lean_grappler(given, gpu=True) == given
  default = estimator_accum.lean_grappler(gpu=True)
  assert default.allow_soft_placement
  assert not default.graph_options.rewrite_options.disable_tfg_optimizer
  assert (estimator_accum.lean_grappler() ==
          estimator_accum.lean_grappler(
              gpu=bool(tf.config.list_physical_devices("GPU"))))


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(session_config="fast"), TypeError,
     r"session_config must be a tf.compat.v1.ConfigProto or None, got "
     r"'fast' of type str"),
    (dict(gpu="yes"), ValueError,
     r"gpu must be True, False or None \(ask TensorFlow\), got 'yes'"),
])
def test_bad_arguments_are_one_line(arguments, error, message):
  with pytest.raises(error, match=message):
    estimator_accum.lean_grappler(**arguments)


def _trained(config):
  """Weights after 3 windows of 2 x k=2 (dense layers, layer norm, GELU,
  keyed dropout, the window's end compiled by XLA), and the op types of
  the graph the session ran for a micro-batch at a window's end."""
  rng = np.random.RandomState(0)
  features = rng.normal(size=[12, 6]).astype(np.float32)
  targets = rng.normal(size=[12, 1]).astype(np.float32)
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 6])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    key = tf.compat.v1.placeholder(tf.int64, [None])
    hidden = tf.Variable(rng.normal(size=[6, 16]).astype(np.float32))
    out = tf.Variable(rng.normal(size=[16, 1]).astype(np.float32))
    h = tf.nn.gelu(tf.matmul(x, hidden))
    mean, variance = tf.nn.moments(h, [1], keepdims=True)
    h = (h - mean) * tf.math.rsqrt(variance + 1e-6)
    h = estimator_accum.keyed_dropout(h, 0.2, key, seed=3, site="h")
    loss = tf.reduce_mean(tf.square(tf.matmul(h, out) - y))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(0.05), 2, clip_norm=1.0,
        fused_apply=True, summaries=False)
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for start in range(0, 12, 2):
        rows = slice(start, start + 2)
        session.run(train_op, {x: features[rows], y: targets[rows],
                               key: np.arange(12)[rows]},
                    options=options, run_metadata=metadata)
      ops = sorted(n.op for g in metadata.partition_graphs for n in g.node)
      return session.run([hidden, out]), ops


@pytest.mark.grappler
def test_the_session_runs_the_same_graph_to_the_same_weights():
  """TensorFlow's full Grappler (Estimator's default config) against the
  lean one: the same ops run, but for how two constants reach the window's
  branch (TFG's control-flow passes take them through the branch's Switch
  and Identity ops; without TFG they are constants of their own), and the
  weights agree to the last bit."""
  full, full_ops = _trained(estimator_accum.lean_grappler(gpu=True))
  lean, lean_ops = _trained(estimator_accum.lean_grappler(gpu=False))
  full_count, lean_count = (collections.Counter(full_ops),
                            collections.Counter(lean_ops))
  assert set(full_count - lean_count) <= {"Identity", "Switch"}
  assert set(lean_count - full_count) <= {"Const"}
  assert sum((full_count - lean_count).values()) <= 3
  # And Grappler did rewrite that graph: without it another graph runs.
  off = tf.compat.v1.ConfigProto()
  off.graph_options.rewrite_options.disable_meta_optimizer = True
  assert _trained(off)[1] != full_ops
  for expected, actual in zip(full, lean):
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.grappler
@pytest.mark.parametrize("option", ["memory_optimization", "layout_optimizer"])
def test_the_memory_and_layout_optimizers_change_nothing(option):
  """Each of the two CPU-only changes alone: the very same ops."""
  config = estimator_accum.lean_grappler(gpu=True)
  setattr(config.graph_options.rewrite_options, option,
          REWRITER.NO_MEM_OPT if option == "memory_optimization" else
          REWRITER.OFF)
  assert _trained(config)[1] == _trained(
      estimator_accum.lean_grappler(gpu=True))[1]
