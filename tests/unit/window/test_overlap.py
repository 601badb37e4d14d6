"""The window's all-reduce overlaps the last micro-batch's backward pass:
the order its sums are sent in, their packs, and a traced step in which
the top layer's sums are read and reduced while the bottom layer's
gradient is still being computed (one process, MirroredStrategy over 2
logical CPUs; the collective job across hosts is benchmarks/overlap_trace.py
and its exactness tests/integration/test_many_hosts.py)."""

import time

import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.window import communication

v1 = tf.compat.v1

K = 2
# How long the bottom layer's gradient takes: long enough that an op that
# overlaps it cannot be mistaken for one that follows it.
SLOW_SECONDS = 1.0


def _three_layers(inputs):
  """A 3-layer MLP (bottom, middle, top); returns (loss, variables)."""
  net = inputs
  variables = []
  for name, width in (("bottom", 16), ("middle", 16), ("top", 1)):
    kernel = v1.get_variable(f"{name}/kernel", [net.shape[-1], width],
                             initializer=v1.glorot_uniform_initializer(seed=1))
    variables.append(kernel)
    net = tf.matmul(net, kernel)
    if name == "bottom":
      net = _slow_backward(net)
    if name != "top":
      net = tf.tanh(net)
  return tf.reduce_mean(tf.square(net)), variables


@tf.custom_gradient
def _slow_backward(x):
  """The identity, whose gradient sleeps SLOW_SECONDS first: the bottom
  layer's gradient is ready that long after the others."""

  def gradient(upstream):
    def sleep(value):
      time.sleep(SLOW_SECONDS)
      return value

    slowed = tf.py_function(sleep, [upstream], upstream.dtype,
                            name="slow_gradient")
    return tf.ensure_shape(slowed, upstream.shape)

  return tf.identity(x), gradient


def test_the_sums_are_sent_in_the_order_the_backward_makes_them():
  with tf.Graph().as_default():
    loss, variables = _three_layers(tf.ones([4, 8]))
    gradients = tf.gradients(loss, variables)
    assert communication.ready_order(gradients) == [2, 1, 0]
    # Given in any order, the backward's order comes out.
    assert communication.ready_order(gradients[::-1]) == [0, 1, 2]


@pytest.mark.parametrize("sizes, bytes_per_pack, expected", [
    ([4, 4, 4], 0, [[0, 1, 2]]),
    ([4, 4, 4], 1, [[0], [1], [2]]),
    # A pack is closed once it holds more than bytes_per_pack.
    ([4, 4, 4, 4], 6, [[0, 1], [2, 3]]),
    ([10, 1, 1, 10], 8, [[0], [1, 2, 3]]),
    ([], 8, []),
])
def test_packs(sizes, bytes_per_pack, expected):
  assert communication.packs(sizes, bytes_per_pack) == expected


def _traced_window_end(overlap):
  """Trains one window of K micro-batches on 2 replicas; returns the ops
  of its last micro-batch's trace as [(name, type, start us, end us)]."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  graph = tf.Graph()
  with graph.as_default(), strategy.scope():
    v1.train.get_or_create_global_step()

    def build():
      loss, _ = _three_layers(tf.ones([4, 8]))
      # One pack per tensor, as a model of many MB has many packs.
      return estimator_accum.build_accumulating_train_op(
          loss, v1.train.GradientDescentOptimizer(0.1), K, summaries=False,
          log_every_n_micro_batches=None, overlap_backward=overlap,
          communication_options=tf.distribute.experimental.
          CommunicationOptions(bytes_per_pack=1))

    train_op = strategy.group(strategy.extended.call_for_each_replica(build))
    # Each replica's sleeping gradient holds a thread of the session's
    # pool: more threads than the 2 of this machine's cores leave others
    # for the rest of the step (a pool of this session's own: sessions
    # share the pool of the process's first one otherwise).
    config = v1.ConfigProto(inter_op_parallelism_threads=8,
                            use_per_session_threads=True,
                            device_count={"CPU": 2})
    with v1.Session(graph=graph, config=config) as session:
      session.run(v1.global_variables_initializer())
      for _ in range(K - 1):
        session.run(train_op)
      metadata = v1.RunMetadata()
      session.run(train_op, options=v1.RunOptions(
          trace_level=v1.RunOptions.FULL_TRACE), run_metadata=metadata)
  ops = []
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      kind = node.timeline_label.split("(")[0].split(" = ")[-1].strip()
      start = node.all_start_micros
      ops.append((node.node_name, kind, start,
                  start + node.all_end_rel_micros))
  return ops


@pytest.mark.parametrize("overlap", [True, False])
def test_the_top_layers_sums_leave_while_the_bottom_layer_computes(overlap):
  ops = _traced_window_end(overlap)
  slow = [end for name, _, _, end in ops if "slow_gradient" in name]
  assert len(slow) == 2, sorted(ops)  # one per replica
  bottom_ready = min(slow)
  # MirroredStrategy reduces CPU replicas with collectives: one per pack.
  packs = [start for name, kind, start, _ in ops
           if "end_of_window" in name and kind.startswith("CollectiveReduce")]
  assert len(packs) >= 3, sorted(ops)
  lead = (bottom_ready - min(packs)) / 1e6
  if overlap:
    assert lead > 0.5 * SLOW_SECONDS, (
        f"the first pack started {lead:.2f} s before the bottom layer's "
        "gradient was ready, not during its backward")
  else:
    assert lead < 0, f"a pack started {lead:.2f} s before the backward ended"


def test_overlap_backward_is_checked():
  with tf.Graph().as_default():
    w = v1.get_variable("w", initializer=tf.ones([3]))
    with pytest.raises(TypeError, match="overlap_backward must be True or "
                       "False, got 'yes' of type str"):
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w), v1.train.GradientDescentOptimizer(0.1), 2,
          overlap_backward="yes")
