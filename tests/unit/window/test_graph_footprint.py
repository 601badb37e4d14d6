"""What the accumulating graph holds besides the accumulators: no hidden copy.

Zeros of a static shape (`tf.zeros`, `zeros_initializer`) are folded by
Grappler into a Const node holding the whole tensor, which the session's
executors then keep for as long as the session lives: a second copy of every
accumulator under Grappler's 10 MB limit. The accumulators are initialized
and zeroed at every window's end, so both must use zeros Grappler cannot
fold. Checked on the graphs the session really runs (its partition graphs,
after Grappler), with both control flows.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

pytestmark = pytest.mark.grappler  # Grappler's constant folding is the subject

_SHAPE = (256, 256)


def _constant_sizes(graph_def):
  """Element counts of every Const in `graph_def` and its function library."""
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes += list(function.node_def)
  return {node.name: tf.make_ndarray(node.attr["value"].tensor).size
          for node in nodes if node.op == "Const"}


def test_window_state_is_never_a_folded_constant(control_flow):
  del control_flow
  k = 2
  graph = tf.Graph()
  with graph.as_default():
    # A random initializer: a ones or zeros one would itself be folded.
    weights = tf.compat.v1.get_variable(
        "weights", _SHAPE,
        initializer=tf.compat.v1.random_normal_initializer(seed=1))
    inputs = tf.constant(np.linspace(-1.0, 1.0, 4 * _SHAPE[0]),
                         tf.float32, shape=[4, _SHAPE[0]])
    loss = tf.reduce_mean(tf.square(tf.matmul(inputs, weights)))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), k,
        summaries=False)
    accumulator = estimator_accum.get_accumulation_state().accumulators[0]
    initializer = tf.compat.v1.global_variables_initializer()
  options = tf.compat.v1.RunOptions(output_partition_graphs=True)
  sizes = {}
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(initializer)
    initial = session.run(weights)
    for op in [initializer] + [train_op] * (2 * k):
      metadata = tf.compat.v1.RunMetadata()
      session.run(op, options=options, run_metadata=metadata)
      for partition in metadata.partition_graphs:
        sizes.update(_constant_sizes(partition))
    # The window's end zeroed the accumulator, and training happened.
    np.testing.assert_array_equal(session.run(accumulator.total), 0.0)
    assert not np.allclose(session.run(weights), initial)
  assert sizes, "the partition graphs should hold some constants"
  variable_size = _SHAPE[0] * _SHAPE[1]
  large = {name: size for name, size in sizes.items()
           if size >= variable_size}
  assert not large, (
      f"constants as large as the {_SHAPE} variable in the session's graphs "
      f"(hidden copies of the window state): {large}")
