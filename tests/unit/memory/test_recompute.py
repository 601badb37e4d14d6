"""estimator_accum.recompute: the gradient of the forward pass that ran
(dropout included), equal to no recomputation where nothing is random,
variables made once under their own names, the recomputation held back
until its gradient is needed, and what cannot run twice refused."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

WIDTH, INNER, BATCH = 6, 16, 5


def _block(rate=0.0, name="block"):
  """A residual MLP block that makes its own variables."""

  def block(h):
    with tf.compat.v1.variable_scope(name):
      kernel_up = tf.compat.v1.get_variable(
          "up", [WIDTH, INNER],
          initializer=tf.compat.v1.initializers.random_normal(seed=1))
      kernel_down = tf.compat.v1.get_variable(
          "down", [INNER, WIDTH],
          initializer=tf.compat.v1.initializers.random_normal(seed=2))
    inner = tf.nn.relu(tf.matmul(h, kernel_up))
    if rate:
      inner = tf.nn.dropout(inner, rate=rate)
    return h + tf.matmul(inner, kernel_down)

  return block


def _stack_gradients(recompute, rate=0.0, blocks=3, steps=1):
  """Gradients of a stack of blocks by every variable and the input."""
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(7)
    x = tf.constant(np.random.RandomState(0).randn(BATCH, WIDTH),
                    tf.float32)
    h = x
    for index in range(blocks):
      block = _block(rate, f"block_{index}")
      h = (estimator_accum.recompute(block) if recompute else block)(h)
    loss = tf.reduce_sum(tf.square(h))
    variables = tf.compat.v1.trainable_variables()
    gradients = tf.gradients(loss, variables + [x])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = [session.run(gradients) for _ in range(steps)]
  return [v.name for v in variables], values


def test_equals_no_recomputation_without_random_ops():
  names, expected = _stack_gradients(recompute=False)
  same_names, actual = _stack_gradients(recompute=True)
  assert same_names == names
  assert len(names) == 6  # made once each
  for name, want, got in zip(names + ["x"], expected[0], actual[0]):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7,
                               err_msg=name)


def test_dropout_gradient_is_the_gradient_of_the_forward_that_ran():
  """One dense layer and dropout at 0.5: the kernel's true gradient is
  x^T (mask * 2 * c), and the mask is read off the forward's output."""
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(3)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(BATCH, WIDTH), tf.float32)
    c = rng.randn(BATCH, INNER).astype(np.float32)

    @estimator_accum.recompute
    def layer(h):
      kernel = tf.compat.v1.get_variable("kernel", [WIDTH, INNER])
      return tf.nn.dropout(tf.matmul(h, kernel), rate=0.5)

    y = layer(x)
    kernel = tf.compat.v1.trainable_variables()[0]
    (gradient,) = tf.gradients(tf.reduce_sum(y * c), [kernel])
    masks = []
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(4):
        y_value, gradient_value, x_value = session.run([y, gradient, x])
        mask = (y_value != 0).astype(np.float32)
        true = x_value.T @ (mask * 2.0 * c)
        np.testing.assert_allclose(gradient_value, true, rtol=1e-5,
                                   atol=1e-5, err_msg=f"step {step}")
        masks.append(mask)
  # A new mask every run, not one replayed forever.
  assert len({m.tobytes() for m in masks}) == len(masks)
  assert 0.2 < np.mean(masks) < 0.8


def _dropout_gradient_error(wrap, runs=4):
  """(largest |gradient - true gradient|, largest true entry) of one dense
  layer with dropout 0.5 wrapped by `wrap`; the true gradient is that of
  the forward pass that ran, its mask read off the output."""
  rng = np.random.RandomState(0)
  x_value = rng.randn(BATCH, WIDTH).astype(np.float32)
  c = rng.randn(BATCH, INNER).astype(np.float32)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(11)

    def layer(h):
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=tf.compat.v1.AUTO_REUSE):
        kernel = tf.compat.v1.get_variable("kernel", [WIDTH, INNER])
      return tf.nn.dropout(tf.matmul(h, kernel), rate=0.5)

    y = wrap(layer)(tf.constant(x_value))
    kernel = tf.compat.v1.trainable_variables()[0]
    (gradient,) = tf.gradients(tf.reduce_sum(y * c), [kernel])
    worst = largest = 0.0
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(runs):
        y_value, gradient_value = session.run([y, gradient])
        true = x_value.T @ ((y_value != 0) * 2.0 * c)
        worst = max(worst, float(np.abs(gradient_value - true).max()))
        largest = max(largest, float(np.abs(true).max()))
  return worst, largest


def test_tensorflow_recompute_grad_draws_a_new_mask_where_this_replays_it():
  """The comparison the docs quote: TF 2.15's tf.recompute_grad in a graph
  takes the gradient of a dropout mask the forward pass never drew."""
  theirs, largest = _dropout_gradient_error(tf.recompute_grad)
  ours, _ = _dropout_gradient_error(estimator_accum.recompute)
  assert theirs > 0.2 * largest, (theirs, largest)
  assert ours < 1e-5 * largest, (ours, largest)


def test_the_recomputation_waits_for_the_gradient_of_its_outputs():
  """Every recomputed op of block 0 runs after the gradient that reaches
  block 0's output exists: the gradient of block 1's input."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [BATCH, WIDTH])
    with tf.name_scope("first"):
      h0 = estimator_accum.recompute(_block(0.5, "block_0"))(x)
    h1 = estimator_accum.recompute(_block(0.5, "block_1"))(h0)
    before = len(graph.get_operations())
    tf.gradients(tf.reduce_sum(h1), [x])
    copies = [op for op in graph.get_operations()[before:] if op.name.split(
        "IdentityN_grad/", 1)[-1].startswith("recompute/")]
    recomputed = [op for op in copies if "/recompute/first/" in op.name]
    assert len(recomputed) > 5, [op.name for op in recomputed]
    # Block 1's recomputation, which block 0's gradient comes out of.
    block_1 = {op for op in copies if "/first/" not in op.name}
    assert block_1
    for op in recomputed:
      assert support.depends_on(op, block_1), op.name


@pytest.mark.keras2
def test_variables_keep_their_names_and_layers_work():
  def names(recompute):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.zeros([BATCH, WIDTH])

      def block(h):
        h = tf.compat.v1.layers.dense(h, INNER, tf.nn.relu, name="up")
        return tf.compat.v1.layers.dense(h, WIDTH, name="down")

      with tf.compat.v1.variable_scope("bert"):
        (estimator_accum.recompute(block) if recompute else block)(x)
      return sorted(v.name for v in tf.compat.v1.global_variables())

  assert names(True) == names(False) == [
      "bert/down/bias:0", "bert/down/kernel:0", "bert/up/bias:0",
      "bert/up/kernel:0"]


def test_closed_over_tensors_get_their_gradient():
  """A block reading a tensor it did not take as an argument (a bias, a
  variable read outside) still passes the gradient on to it."""
  graph = tf.Graph()
  with graph.as_default():
    rng = np.random.RandomState(1)
    x = tf.constant(rng.randn(BATCH, WIDTH), tf.float32)
    kernel = tf.compat.v1.get_variable(
        "kernel", initializer=tf.constant(rng.randn(WIDTH, WIDTH),
                                          tf.float32))
    bias = tf.constant(rng.randn(WIDTH), tf.float32) * 2.0

    def block(h):
      return tf.tanh(tf.matmul(h, kernel) + bias)

    losses = [tf.reduce_sum(tf.square(f(x))) for f in (
        block, estimator_accum.recompute(block))]
    gradients = [tf.gradients(loss, [kernel, bias, x]) for loss in losses]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      expected, actual = session.run(gradients)
  for want, got in zip(expected, actual):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_inside_a_tf_function_with_a_gradient_tape():
  layers = [tf.keras.layers.Dense(INNER, "relu"), tf.keras.layers.Dense(WIDTH)]
  x = tf.constant(np.random.RandomState(2).randn(BATCH, WIDTH), tf.float32)

  def block(h):
    return h + layers[1](layers[0](h))

  @tf.function
  def gradients(recompute):
    with tf.GradientTape() as tape:
      tape.watch(x)
      f = estimator_accum.recompute(block) if recompute else block
      loss = tf.reduce_sum(tf.square(f(f(x))))
    variables = layers[0].trainable_variables + layers[1].trainable_variables
    return tape.gradient(loss, variables + [x])

  expected = gradients(False)
  actual = gradients(True)
  assert len(actual) == 5
  for want, got in zip(expected, actual):
    assert got is not None
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6,
                               atol=1e-7)


def test_refuses_an_op_that_changes_state():
  with tf.Graph().as_default():
    counter = tf.compat.v1.get_variable("counter", [], use_resource=True)

    def block(h):
      with tf.control_dependencies([counter.assign_add(1.0)]):
        return h * 2.0

    with pytest.raises(ValueError, match=r"recompute\(block\): op '.*"
                       r"AssignAddVariableOp' .*changes state"):
      estimator_accum.recompute(block)(tf.zeros([2]))


def test_refuses_control_flow():
  with tf.Graph().as_default():
    def block(h):
      return tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h)

    with pytest.raises(ValueError, match=r"recompute\(block\): op .* is "
                       r"control flow"):
      estimator_accum.recompute(block)(tf.zeros([2]))


def test_eager_calls_run_as_they_are_and_non_tensor_arguments_refused():
  np.testing.assert_array_equal(
      estimator_accum.recompute(lambda h: h * 2.0)(tf.ones([2])), [2.0, 2.0])
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match="positional argument 1 must be a "
                       "tensor, got None"):
      estimator_accum.recompute(lambda h, act: h)(tf.zeros([2]), None)
  with pytest.raises(TypeError, match="fn must be callable"):
    estimator_accum.recompute(3)


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", ["momentum", "adam"])
def test_inside_the_window_equals_the_big_batch(optimizer_name, tmp_path):
  """Estimator, k=2: the recomputed hidden layer trains as plain big-batch
  TensorFlow (no recomputation) does, the embedding's sparse gradient
  outside the block."""
  optimizer_fn = {
      "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.2, 0.9),
      "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05)}[optimizer_name]
  k, micro_batch, updates = 2, 4, 3
  data = support.make_data(k * micro_batch * updates)
  clip_norm = 0.5 * support.reference_gradient_norm(data, k * micro_batch)
  expected = support.reference_train(optimizer_fn, data, k * micro_batch,
                                     updates, clip_norm=clip_norm)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * updates,
      clip_norm=clip_norm, recompute=True)
  support.assert_trained_like_big_batch(
      estimator, actual, expected, k * updates, updates,
      f"{optimizer_name} with recompute")


def test_blocks_sharing_variables_and_reading_earlier_outputs():
  """Two calls of one block (shared variables), the second also reading the
  first block's output by closure: each path is counted once."""
  graph = tf.Graph()
  with graph.as_default():
    rng = np.random.RandomState(4)
    x = tf.constant(rng.randn(BATCH, WIDTH), tf.float32)
    kernel = tf.compat.v1.get_variable(
        "kernel", initializer=tf.constant(rng.randn(WIDTH, WIDTH) * 0.5,
                                          tf.float32))

    def gradients(wrap):
      first = wrap(lambda h: tf.tanh(tf.matmul(h, kernel)))(x)
      second = wrap(lambda h: tf.tanh(tf.matmul(h, kernel)) * first)(first)
      return tf.gradients(tf.reduce_sum(tf.square(second)), [kernel, x])

    expected = gradients(lambda f: f)
    actual = gradients(estimator_accum.recompute)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      expected, actual = session.run([expected, actual])
  for want, got in zip(expected, actual):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.estimator
def test_host_accumulators_equal_the_big_batch(tmp_path):
  """accumulator_placement='host': every accumulator is a variable of the
  host's CPU, so every add runs there; the weights are the big batch's."""
  optimizer_fn = lambda: tf.compat.v1.train.AdamOptimizer(0.05)  # noqa: E731
  k, micro_batch, updates = 2, 4, 3
  data = support.make_data(k * micro_batch * updates)
  expected = support.reference_train(optimizer_fn, data, k * micro_batch,
                                     updates)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * updates,
      accumulator_placement="host", recompute=True)
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        k * updates, updates, "host")
  with tf.Graph().as_default():
    features = {key: tf.constant(value[:micro_batch])
                for key, value in data.items() if key != "labels"}
    with tf.device("/device:GPU:0"):
      loss = support.model_loss(features, tf.constant(
          data["labels"][:micro_batch]))
      tf.compat.v1.train.get_or_create_global_step()
      estimator_accum.build_accumulating_train_op(
          loss, tf.compat.v1.train.AdamOptimizer(0.05), k,
          accumulator_placement="host")
    accumulators = [v for v in tf.compat.v1.global_variables()
                    if "/accum" in v.name]
    assert len(accumulators) == 6  # 5 sums and the table's row mask
    for variable in accumulators:
      assert variable.device == "/device:CPU:0", (variable.name,
                                                  variable.device)
    trained = tf.compat.v1.trainable_variables()
    assert all(v.device == "/device:GPU:0" for v in trained)


def test_host_accumulators_are_refused_with_several_replicas():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with tf.Graph().as_default(), strategy.scope():
    def step():
      variable = tf.compat.v1.get_variable("v", [2])
      tf.compat.v1.train.get_or_create_global_step()
      return estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(variable), tf.compat.v1.train.GradientDescentOptimizer(
              0.1), 2, accumulator_placement="host")

    with pytest.raises(ValueError, match="accumulator_placement='host' keeps "
                       "one replica's window in host memory; this train op "
                       "has 2 replicas"):
      strategy.extended.call_for_each_replica(step)


class _Block(tf.keras.layers.Layer):
  """A Keras layer whose block may be recomputed."""

  def __init__(self, recompute, **kwargs):
    super().__init__(**kwargs)
    self.up = tf.keras.layers.Dense(INNER, "relu")
    self.down = tf.keras.layers.Dense(WIDTH)
    self.recompute = recompute

  def call(self, x):
    block = lambda h: h + self.down(self.up(h))  # noqa: E731
    return (estimator_accum.recompute(block) if self.recompute else
            block)(x)


def _keras_model(recompute, weights=None):
  tf.keras.utils.set_random_seed(3)
  inputs = tf.keras.Input([WIDTH])
  hidden = _Block(recompute)(_Block(recompute)(inputs))
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
  if weights is not None:
    model.set_weights(weights)
  return model


@pytest.mark.keras2
def test_keras_fit_with_the_wrapper_equals_plain_keras_at_the_big_batch():
  k, micro_batch, updates = 2, 4, 3
  rng = np.random.RandomState(5)
  x = rng.randn(k * micro_batch * updates, WIDTH).astype(np.float32)
  y = rng.randn(k * micro_batch * updates, 1).astype(np.float32)
  big = _keras_model(False)
  start = big.get_weights()
  big.compile(tf.keras.optimizers.Adam(0.01), "mse")
  big.fit(x, y, batch_size=k * micro_batch, shuffle=False, verbose=0)
  window = _keras_model(True, start)
  window.compile(estimator_accum.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(0.01), k=k), "mse")
  window.fit(x, y, batch_size=micro_batch, shuffle=False, verbose=0)
  moved = max(float(np.abs(a - b).max())
              for a, b in zip(big.get_weights(), start))
  assert moved > 1e-3
  for want, got in zip(big.get_weights(), window.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_optimizer_wrapper_with_recompute_equals_the_big_batch():
  k, micro_batch, updates = 2, 4, 3
  data = support.make_data(k * micro_batch * updates)
  sgd = lambda: tf.compat.v1.train.MomentumOptimizer(0.2, 0.9)  # noqa: E731
  expected = support.reference_train(sgd, data, k * micro_batch, updates)
  with tf.Graph().as_default():
    features = {name: tf.compat.v1.placeholder(
        tf.as_dtype(value.dtype), [None, *value.shape[1:]])
                for name, value in data.items()}
    labels = features.pop("labels")
    loss = support.model_loss(features, labels, recompute=True)
    train_op = estimator_accum.AccumulatingOptimizer(sgd(), k).minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(k * updates):
        batch = slice(step * micro_batch, (step + 1) * micro_batch)
        session.run(train_op, {features.get(n, labels): v[batch]
                               for n, v in data.items()})
      actual = {n: session.run(variables[n]) for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what="wrapper, recompute")
