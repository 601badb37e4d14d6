"""BERT's AdamWeightDecay applies the window in one native pass a variable
(`EaAdamWeightDecay`, estimator_accum/native/adam_weight_decay.cc): the
window's gradient times its scale, the moments, the step and the writes
of the variable and both slots, in place. The op's values are TensorFlow's
ops' bit for bit (shapes around its chunks and vector widths, scales of 1
and not, decay on and off, infinities and NaN, one thread and two), a read
taken before it keeps the old values, and bad inputs are errors naming
them. Through the window: the same weights and slots bit for bit as
TensorFlow's ops, fused_apply or not, clipped or not, k of 1 to 3, a
table's lookup; no XLA compile and no tensor of a variable's size made;
the same checkpoint names; and TensorFlow's ops wherever the one pass does
not apply (a strategy's replicas, LAMB, `one_pass=False`, float64)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum import native
from models.bert import optimization
from tests.helpers import native_kernels, session_threads, tanh_stack

BETA_1, BETA_2, EPSILON, DECAY = 0.9, 0.999, 1e-6, 0.01


def _op_types(graph):
  """{op type: count} over `graph` and the functions of its library."""
  definition = graph.as_graph_def()
  types = collections.Counter(n.op for n in definition.node)
  for function in definition.library.function:
    types.update(n.op for n in function.node_def)
  return types


def _hyperparameters(learning_rate):
  return [tf.constant(value, tf.float32) for value in (
      learning_rate, BETA_1, 1.0 - BETA_1, BETA_2, 1.0 - BETA_2, EPSILON,
      DECAY)]


def _tensorflows_update(p, m, v, g, scale, decay, learning_rate):
  """models.bert.optimization's own ops (`_moments`, `_update`), on the
  gradient times `scale` as the window hands it."""
  lr, b1, omb1, b2, omb2, eps, wd = _hyperparameters(learning_rate)
  g = g * scale
  next_m = b1 * m + omb1 * g
  next_v = b2 * v + omb2 * tf.square(g)
  update = next_m / (tf.sqrt(next_v) + eps)
  if decay:
    update += wd * p
  return p - lr * update, next_m, next_v


def _values(shape, seed=0, special=False):
  rng = np.random.RandomState(seed)
  p = rng.normal(0.0, 0.5, shape).astype(np.float32)
  m = rng.normal(0.0, 1e-3, shape).astype(np.float32)
  v = np.abs(rng.normal(0.0, 1e-4, shape)).astype(np.float32)
  g = rng.normal(0.0, 1.0, shape).astype(np.float32)
  if special and g.size >= 8:
    flat = g.reshape(-1)
    flat[:8] = [0.0, -0.0, 1e30, -1e30, np.inf, np.nan, 1e-40, -3e-39]
  return p, m, v, g


def _both(shape, scale, decay, special=False, threads=None, lr=2e-5):
  """(the op's p, m, v; TensorFlow's ops' p, m, v) from the same values."""
  native_kernels.loaded()
  p0, m0, v0, g0 = _values(shape, special=special)
  with tf.Graph().as_default():
    variables = [tf.Variable(x) for x in (p0, m0, v0)]
    gradient, factor = tf.constant(g0), tf.constant(scale, tf.float32)
    op = native.adam_weight_decay_op()(
        *[x.handle for x in variables], gradient, factor,
        *_hyperparameters(lr), decay=decay)
    plain = _tensorflows_update(*[tf.constant(x) for x in (p0, m0, v0)],
                                gradient, factor, decay, lr)
    config = native_kernels.threads_config(threads)
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      expected = session.run(plain)
      session.run(op)
      return session.run(variables), expected


SHAPES = [[], [0], [1], [7], [1031], [3, 1500], [50_003]]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.37])
@pytest.mark.parametrize("decay", [True, False], ids=["decay", "no_decay"])
def test_the_op_is_tensorflows_ops_bit_for_bit(shape, scale, decay):
  got, expected = _both(shape, scale, decay)
  for name, a, b in zip(("variable", "m", "v"), got, expected):
    assert a.shape == b.shape == tuple(shape), name
    np.testing.assert_array_equal(a, b, err_msg=name)
  if np.prod(shape):
    assert not np.array_equal(got[0], _values(shape)[0])  # it moved


@pytest.mark.parametrize("threads", [1, 2])
def test_infinities_nan_and_subnormals_as_tensorflows_ops(threads):
  got, expected = _both([4099], 0.5, True, special=True, threads=threads)
  for name, a, b in zip(("variable", "m", "v"), got, expected):
    np.testing.assert_array_equal(a, b, err_msg=name)  # NaN where NaN
  assert np.isnan(got[0][5]) and np.isinf(got[2][2])


def test_one_thread_and_two_are_the_same():
  one, _ = _both([200_001], 0.3, True, threads=1)
  two, _ = _both([200_001], 0.3, True, threads=2)
  for a, b in zip(one, two):
    np.testing.assert_array_equal(a, b)


def test_a_read_taken_before_the_update_keeps_the_old_values():
  """The variable's buffer still held by a read is copied first (as
  TensorFlow's own updates do), not written under the reader."""
  native_kernels.loaded()
  p0, m0, v0, g0 = _values([1000])
  with tf.Graph().as_default():
    variables = [tf.Variable(x) for x in (p0, m0, v0)]
    before = variables[0].read_value()
    with tf.control_dependencies([before]):
      op = native.adam_weight_decay_op()(
          *[x.handle for x in variables], tf.constant(g0), 1.0,
          *_hyperparameters(1e-2), decay=True)
    with tf.control_dependencies([op]):
      after = variables[0].read_value()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      held, moved = session.run([before, after])
  np.testing.assert_array_equal(held, p0)
  assert not np.array_equal(moved, p0)


def _run_op(shapes=None, scalars=None, dtype=tf.float32):
  """Runs the op on zeros: variables of `shapes` (all [4]) and `dtype`,
  a gradient of [4], the scalars given ({index: value} over 1.0s)."""
  native_kernels.loaded()
  shapes = shapes or [[4]] * 3
  with tf.Graph().as_default():
    variables = [tf.Variable(tf.zeros(s, dtype)) for s in shapes]
    gradient = tf.zeros([4])
    scalars = [tf.constant((scalars or {}).get(i, 1.0)) for i in range(8)]
    op = native.adam_weight_decay_op()(
        *[x.handle for x in variables], gradient, *scalars, decay=True)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(op)


@pytest.mark.parametrize("index,name", [(0, "variable"), (1, "m"),
                                        (2, "v")])
def test_a_slot_of_another_shape_is_an_error_naming_it(index, name):
  shapes = [[4]] * 3
  shapes[index] = [5]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"{name} and gradient must have the same shape, "
                     rf"got \[5\] and \[4\]"):
    _run_op(shapes)


@pytest.mark.parametrize("index,name", [
    (0, "scale"), (1, "learning_rate"), (2, "beta_1"), (6, "epsilon"),
    (7, "weight_decay_rate")])
def test_a_hyperparameter_that_is_not_a_scalar_is_an_error_naming_it(
    index, name):
  scalars = {index: [1.0, 2.0]}
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"{name} must be a scalar, got shape \[2\]"):
    _run_op(scalars=scalars)


def test_a_float64_variable_is_an_error_naming_it():
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="variable must be float32, got double"):
    _run_op(dtype=tf.float64)


def test_one_pass_that_is_not_a_bool_is_an_error_naming_it():
  with pytest.raises(ValueError, match="one_pass='yes': must be True"):
    optimization.AdamWeightDecayOptimizer(0.1, one_pass="yes")


# Through the window.


def _adamw(one_pass=True):
  return optimization.AdamWeightDecayOptimizer(
      0.05, weight_decay_rate=0.01, exclude_from_weight_decay=["bias"],
      one_pass=one_pass)


def _window_weights(one_pass, k=2, clip_norm=1.0, fused_apply=False,
                    updates=3, graph=None):
  """{name: value} of the variables and slots after `updates` windows of a
  kernel, a bias and a table read by a lookup (unique ids a micro-batch,
  so that the table's sums do not hang on the order of adds), and the op
  types of the graph and its functions."""
  rng = np.random.RandomState(0)
  graph = graph or tf.Graph()
  with graph.as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    table = tf.compat.v1.get_variable("table", initializer=tf.constant(
        rng.normal(0, 0.5, (40, 6)).astype(np.float32)))
    kernel = tf.compat.v1.get_variable("kernel", initializer=tf.constant(
        rng.normal(0, 0.5, (6, 5)).astype(np.float32)))
    bias = tf.compat.v1.get_variable("bias", initializer=tf.constant(
        rng.normal(0, 0.5, (5,)).astype(np.float32)))
    ids = tf.constant(np.stack([rng.permutation(40)[:12] for _ in range(6)])
                      .astype(np.int32))
    looked_up = tf.gather(table, tf.gather(ids, step % 6))
    loss = tf.reduce_sum(tf.square(tf.tanh(
        tf.matmul(looked_up, kernel) + bias)))
    optimizer = _adamw(one_pass)
    op = estimator_accum.build_accumulating_train_op(
        loss, optimizer, k, clip_norm=clip_norm, fused_apply=fused_apply,
        log_every_n_micro_batches=None)
    variables = {v.op.name: v for v in (table, kernel, bias)}
    for name, variable in list(variables.items()):
      for slot in ("m", "v"):
        variables[f"{name}/{slot}"] = optimizer.get_slot(variable, slot)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(k * updates):
        session.run(op)
      values = session.run(variables)
  return values, _op_types(graph)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("clip_norm", [1.0, None], ids=["clip", "no_clip"])
@pytest.mark.parametrize("fused_apply", [True, False],
                         ids=["fused_apply", "unfused"])
def test_the_window_trains_tensorflows_ops_weights_bit_for_bit(
    k, clip_norm, fused_apply):
  native_kernels.loaded()
  one_pass, types = _window_weights(True, k, clip_norm, fused_apply)
  # TensorFlow's ops: one_pass=False, unfused (fused, XLA's rounding).
  plain, plain_types = _window_weights(False, k, clip_norm, False)
  assert types["EaAdamWeightDecay"] == 3, types
  assert plain_types["EaAdamWeightDecay"] == 0, plain_types
  assert sorted(one_pass) == sorted(plain)
  for name in plain:
    np.testing.assert_array_equal(one_pass[name], plain[name], err_msg=name)
  # The windows moved the variables and slots.
  start, _ = _window_weights(True, k, clip_norm, fused_apply, updates=0)
  for name in ("table", "kernel", "bias", "kernel/m", "kernel/v"):
    assert not np.array_equal(one_pass[name], start[name]), name


def test_no_xla_compile_and_none_of_tensorflows_update_ops():
  """fused_apply on one replica: no `jit_compile` function for the
  update (XLA's ~2 s at the main job's start), and none of the ops the
  one pass replaces."""
  native_kernels.loaded()
  graph = tf.Graph()
  _, types = _window_weights(True, fused_apply=True, graph=graph)
  updates = [f.signature.name for f in graph.as_graph_def().library.function
             if "update" in f.signature.name]
  assert updates == [], updates
  _, plain = _window_weights(False, fused_apply=False)
  assert types["EaAdamWeightDecay"] == 3, types
  # Each variable's square root and quotient (the norm keeps its root).
  assert plain["Sqrt"] - types["Sqrt"] == 3, (plain, types)
  assert plain["RealDiv"] - types["RealDiv"] >= 3, (plain, types)


def test_the_checkpoint_holds_the_same_names():
  native_kernels.loaded()
  names = {}
  for one_pass in (True, False):
    with tf.Graph().as_default():
      tanh_stack.train_op(_adamw(one_pass), fused_apply=True)
      names[one_pass] = sorted(v.op.name
                               for v in tf.compat.v1.global_variables())
  assert names[True] == names[False]
  assert any(name.endswith("/adam_m") for name in names[True])


def _graph_types(optimizer, **options):
  with tf.Graph().as_default() as graph:
    tanh_stack.train_op(optimizer, **options)
  return _op_types(graph)


@pytest.mark.parametrize("case", ["one_pass_false", "lamb", "float64"])
def test_where_the_one_pass_does_not_apply_tensorflows_ops_do(case):
  native_kernels.loaded()
  if case == "float64":
    with tf.Graph().as_default():
      kernel = tf.compat.v1.get_variable("kernel", initializer=tf.constant(
          np.ones((3, 3)), tf.float64))
      assert not _adamw().applies_in_one_pass([kernel])
    return
  optimizer = (_adamw(one_pass=False) if case == "one_pass_false"
               else optimization.make_optimizer("lamb", 0.05))
  types = _graph_types(optimizer, fused_apply=True)
  assert types["EaAdamWeightDecay"] == 0, types


def test_a_strategys_replicas_apply_through_tensorflows_ops():
  """MirroredStrategy's replicas apply through its own cross-replica
  calls (where the compiled apply is compiled apart too): TensorFlow's
  ops there."""
  native_kernels.loaded()  # two logical CPUs: tests/conftest.py
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with tf.Graph().as_default() as graph, strategy.scope():
    optimizer = _adamw()
    strategy.extended.call_for_each_replica(
        lambda: tanh_stack.train_op(optimizer, rows=8))
  types = _op_types(graph)
  assert types["EaAdamWeightDecay"] == 0, types


@pytest.mark.memory
@pytest.mark.parametrize("threads", ["default_threads", "one_thread"])
def test_the_applying_micro_batch_makes_no_tensor_of_a_variables_size(
    threads):
  """Four 1M-parameter variables (4 MB each), the BFC allocator,
  fused_apply (the sums zeroed in place): the window's end (the one pass
  in place) allocates less than a quarter of one variable in all its ops
  together, as the compiled apply does (test_fused_apply.py)."""
  native_kernels.loaded()
  config = session_threads.ONE_THREAD if threads == "one_thread" else None
  variable = 4 * 10**6
  traced = tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  with tf.Graph().as_default() as graph:
    train_op = tanh_stack.train_op(_adamw(), widths=[1000] * 5, rows=4,
                                   fused_apply=True)
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(5):  # two windows, and one more micro-batch
        session.run(train_op)
      metadata = tf.compat.v1.RunMetadata()
      session.run(train_op, options=traced, run_metadata=metadata)
  assert _op_types(graph)["EaAdamWeightDecay"] == 4
  made = {node.node_name: sum(m.total_bytes for m in node.memory)
          for device in metadata.step_stats.dev_stats
          for node in device.node_stats
          if "end_of_window/" in node.node_name}
  ran = [name for name in made if "EaAdamWeightDecay" in name or
         "adam_weight_decay" in name.lower()]
  assert ran, sorted(made)[:20]
  assert sum(made.values()) < variable / 4, {
      name: size for name, size in made.items() if size > 10000}
