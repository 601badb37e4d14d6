"""The window-aware BatchNorm: moving statistics after each window equal one
BatchNorm update (tf.compat.v1.layers, plain TensorFlow) on the window's
concatenated batch — on one device, over MirroredStrategy replicas, with
uneven micro-batches, across a restart mid-window — and a skipped window
moves nothing; plain BatchNorm's statistics do not."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

K, MICRO_BATCH, MOMENTUM, EPSILON = 4, 5, 0.9, 1e-3
SHAPE = [4, 4, 3]
REPLICAS = 2


def _images(micro_batches, seed=0, micro_batch=MICRO_BATCH):
  rng = np.random.default_rng(seed)
  # Micro-batches with different means, so the variance of the means counts.
  offsets = np.repeat(np.arange(micro_batches) % 7 * 2.0, micro_batch)
  return (rng.normal(size=[micro_batches * micro_batch] + SHAPE) * 1.5 +
          offsets[:, None, None, None]).astype(np.float32)


def _moving(get):
  return [get("bn/moving_mean"), get("bn/moving_variance")]


def _plain_batch_norm(images, batches, momentum=MOMENTUM):
  """Plain BatchNorm, one update per batch of `batches` (example counts)."""
  return support.reference_batch_norm(images, batches, momentum, EPSILON)


def _loss(images, labels, training, k, weights=1.0):
  net = estimator_accum.batch_norm(images, training, k, momentum=MOMENTUM,
                                   epsilon=EPSILON, name="bn")
  logits = tf.compat.v1.layers.dense(tf.reshape(net, [-1, 48]), 2)
  return tf.reduce_mean(weights * tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


def _session_run(images, micro_batch_sizes, k=K):
  """Trains with the accumulating train op on one device, a micro-batch of
  each size in turn; returns the moving statistics."""
  with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, [None] + SHAPE)
    loss = _loss(inputs, tf.zeros_like(inputs[:, 0, 0, 0], tf.int32), True, k)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), k)
    by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      support.run_in_order(session, train_op, inputs, images,
                           micro_batch_sizes)
      return _moving(lambda name: session.run(by_name[name]))


def _assert_statistics(actual, expected, what):
  for got, want, which in zip(actual, expected, ("mean", "variance"),
                              strict=True):
    np.testing.assert_allclose(
        got, want, rtol=1e-5, atol=1e-6,
        err_msg=f"{what}: moving {which} differs from plain BatchNorm on the "
                "window's concatenated batch")


@pytest.mark.keras2
def test_moving_statistics_after_each_window_equal_the_big_batch():
  images = _images(3 * K)
  actual = _session_run(images, [MICRO_BATCH] * 3 * K)
  expected = _plain_batch_norm(images, [K * MICRO_BATCH] * 3)
  _assert_statistics(actual, expected, "one device, 3 windows")
  # What plain BatchNorm does under accumulation: k updates from
  # micro-batches of B, even with the horizon-adjusted momentum.
  plain = _plain_batch_norm(images, [MICRO_BATCH] * 3 * K,
                            estimator_accum.adjusted_momentum(MOMENTUM, K))
  assert np.abs(plain[1] - expected[1]).max() > 0.1


@pytest.mark.keras2
def test_uneven_micro_batches_weigh_by_their_size():
  images = _images(K)
  sizes = [MICRO_BATCH, 2, MICRO_BATCH, 3]
  actual = _session_run(images, sizes)
  expected = _plain_batch_norm(images, [sum(sizes)])
  _assert_statistics(actual, expected, "micro-batches of 5, 2, 5, 3")
  # The mean of the micro-batches' means would be another value.
  assert np.abs(actual[0] - expected[0]).max() < 1e-5
  equal_weights = np.mean([images[s:s + n].mean((0, 1, 2)) for s, n in
                           zip(np.cumsum([0] + sizes[:-1]), sizes)], 0)
  assert np.abs(equal_weights * (1 - MOMENTUM) - expected[0]).max() > 1e-2


@pytest.mark.keras2
def test_moving_statistics_do_not_move_inside_a_window():
  mean, variance = _session_run(_images(K), [MICRO_BATCH] * (K - 1))
  np.testing.assert_array_equal(mean, np.zeros(3))
  np.testing.assert_array_equal(variance, np.ones(3))


def test_adjusted_momentum_and_bad_arguments():
  assert estimator_accum.adjusted_momentum(0.99, 1) == 0.99
  assert abs(estimator_accum.adjusted_momentum(0.81, 2) - 0.9) < 1e-12
  with pytest.raises(ValueError, match="momentum must be in"):
    estimator_accum.adjusted_momentum(1.0, 4)
  with tf.Graph().as_default(), pytest.raises(ValueError, match="k must be"):
    estimator_accum.batch_norm(tf.zeros([2, 3]), True, 0)


def test_training_must_be_known_when_the_graph_is_built():
  with tf.Graph().as_default():
    fed = tf.compat.v1.placeholder(tf.bool, [])
    with pytest.raises(TypeError, match="only known at run time"):
      estimator_accum.batch_norm(tf.zeros([2, 3]), fed, 2)
    with pytest.raises(TypeError, match="training must be a Python bool, "
                       "got 'yes'"):
      estimator_accum.batch_norm(tf.zeros([2, 3]), "yes", 2)
    # A constant tensor is its value: True adds to the window, False not.
    estimator_accum.batch_norm(tf.ones([2, 3]), tf.constant(True), 2,
                               name="constant_true")
    estimator_accum.batch_norm(tf.ones([2, 3]), np.bool_(False), 2,
                               name="constant_false")
    windows = [v.op.name for v in tf.compat.v1.global_variables()
               if "window_sum" in v.op.name]
    assert windows == ["constant_true/window_sum"]


@pytest.mark.keras2
def test_k_must_match_and_layers_come_before_the_train_op():
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  with tf.Graph().as_default():
    loss = _loss(tf.ones([2] + SHAPE), tf.zeros([2], tf.int32), True, 4)
    with pytest.raises(ValueError, match=r"'bn' was built with k=4 and "
                       r"build_accumulating_train_op with k=2"):
      estimator_accum.build_accumulating_train_op(loss, optimizer, 2)
  with tf.Graph().as_default():
    loss = tf.reduce_sum(tf.compat.v1.get_variable("w", [1]))
    estimator_accum.build_accumulating_train_op(loss, optimizer, 2)
    with pytest.raises(ValueError, match="'late' is built after "
                       "build_accumulating_train_op"):
      estimator_accum.batch_norm(tf.ones([2, 3]), True, 2, name="late")


def _model_fn(features, labels, mode, params):
  training = mode == tf.estimator.ModeKeys.TRAIN
  loss = _loss(features["images"], labels, training, params["k"],
               features["weights"])
  train_op = estimator_accum.build_accumulating_train_op(
      loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), params["k"])
  return tf.estimator.EstimatorSpec(
      mode, loss=estimator_accum.reportable_loss(loss), train_op=train_op)


def _estimator(model_dir, strategy=None):
  replicas = strategy.num_replicas_in_sync if strategy else 1
  return tf.estimator.Estimator(
      _model_fn, str(model_dir), params={"k": K},
      config=tf.estimator.RunConfig(
          tf_random_seed=0, train_distribute=strategy,
          log_step_count_steps=1_000_000,
          session_config=tf.compat.v1.ConfigProto(
              device_count={"CPU": replicas})))


def _input_fn(images, weights=None):
  """Micro-batches of images, labels and loss weights (default 1), in order."""
  if weights is None:
    weights = np.ones(len(images), np.float32)

  def input_fn():
    labels = np.arange(len(images), dtype=np.int32) % 2
    features = {"images": images, "weights": weights}
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        MICRO_BATCH)
  return input_fn


@pytest.mark.estimator
def test_mirrored_replicas_update_from_the_whole_window(control_flow,
                                                        tmp_path):
  """2 replicas x k micro-batches of B: the moving statistics of one device
  with batch 2*k*B, though each replica sees only its own micro-batches."""
  windows = 2
  images = _images(REPLICAS * K * windows)
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(REPLICAS)])
  estimator = _estimator(tmp_path, strategy)
  estimator.train(_input_fn(images), max_steps=K * windows)
  expected = _plain_batch_norm(images, [REPLICAS * K * MICRO_BATCH] * windows)
  _assert_statistics(_moving(estimator.get_variable_value), expected,
                     f"MirroredStrategy x{REPLICAS}, {control_flow}")
  assert estimator.get_variable_value("global_step") == K * windows
  # Guard: one replica's micro-batches alone give other statistics.
  replica_0 = np.concatenate([images[i:i + MICRO_BATCH] for i in range(
      0, len(images), REPLICAS * MICRO_BATCH)])
  alone = _plain_batch_norm(replica_0, [K * MICRO_BATCH] * windows)
  assert np.abs(alone[1] - expected[1]).max() > 1e-2


@pytest.mark.estimator
def test_a_skipped_window_moves_nothing(tmp_path):
  """A NaN loss weight in the second window: its gradient is NaN, its
  images (and so its statistics) are finite; the window is skipped whole."""
  images = _images(3 * K)
  weights = np.ones(len(images), np.float32)
  weights[K * MICRO_BATCH + 7] = np.nan
  estimator = _estimator(tmp_path)
  estimator.train(_input_fn(images, weights), max_steps=3 * K)
  kept = np.concatenate([images[:K * MICRO_BATCH],
                         images[2 * K * MICRO_BATCH:]])
  expected = _plain_batch_norm(kept, [K * MICRO_BATCH] * 2)
  _assert_statistics(_moving(estimator.get_variable_value), expected,
                     "windows 1 and 3 of 3")
  assert estimator.get_variable_value(
      "gradient_accumulation/skipped_windows") == 1


@pytest.mark.estimator
def test_a_restart_mid_window_resumes_the_window(tmp_path):
  images = _images(2 * K)
  estimator = _estimator(tmp_path / "stopped")
  estimator.train(_input_fn(images), max_steps=K + 2)  # Saves at step K+2.
  resumed = _estimator(tmp_path / "stopped")
  resumed.train(lambda: _input_fn(images)().skip(K + 2), max_steps=2 * K)
  expected = _plain_batch_norm(images, [K * MICRO_BATCH] * 2)
  _assert_statistics(_moving(resumed.get_variable_value), expected,
                     "stopped after micro-batch 6 of 8, restarted")
  assert resumed.get_variable_value("bn/window_count") == 0


def _cnn_model_fn(features, labels, mode, params):
  training = mode == tf.estimator.ModeKeys.TRAIN
  net = tf.compat.v1.layers.conv2d(features, 8, 3, padding="same",
                                   use_bias=False)
  net = tf.nn.relu(estimator_accum.batch_norm(net, training, params["k"],
                                              momentum=0.8))
  logits = tf.compat.v1.layers.dense(tf.reduce_mean(net, [1, 2]), 2)
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))
  if mode == tf.estimator.ModeKeys.EVAL:
    accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops={"accuracy": accuracy})
  train_op = estimator_accum.build_accumulating_train_op(
      loss, tf.compat.v1.train.AdamOptimizer(0.01), params["k"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.estimator
def test_small_cnn_with_it_trains_under_accumulation(tmp_path):
  rng = np.random.default_rng(1)
  images = rng.normal(size=(256, 8, 8, 1)).astype(np.float32)
  labels = rng.integers(0, 2, size=256).astype(np.int32)
  images[labels == 1, :, :4] += 1.0  # Class 1 is brighter on the left.

  def input_fn(repeat):
    def fn():
      dataset = tf.data.Dataset.from_tensor_slices((images, labels))
      return dataset.repeat(repeat).batch(16)
    return fn

  estimator = tf.estimator.Estimator(
      _cnn_model_fn, str(tmp_path), params={"k": 2},
      config=tf.estimator.RunConfig(tf_random_seed=0))
  estimator.train(input_fn(8), max_steps=128)
  result = estimator.evaluate(input_fn(1))
  assert result["accuracy"] > 0.9, result
  assert estimator.get_variable_value("global_step") == 128
  moving_mean = estimator.get_variable_value("batch_normalization/moving_mean")
  assert np.abs(moving_mean).max() > 0.01
