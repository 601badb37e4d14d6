"""The window-aware BatchNorm: moving statistics after a window equal one
BatchNorm update on the concatenated batch; plain BatchNorm's do not."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

K, MICRO_BATCH, MOMENTUM, EPSILON = 4, 5, 0.9, 1e-3


def _images(seed=0):
  rng = np.random.default_rng(seed)
  # Micro-batches with different means, so the variance of the means counts.
  offsets = np.repeat(np.arange(K) * 2.0, MICRO_BATCH)[:, None, None, None]
  return (rng.normal(size=(K * MICRO_BATCH, 4, 4, 3)) * 1.5 + offsets
          ).astype(np.float32)


def _window_statistics(images, micro_batches):
  """Runs `micro_batches` micro-batches through batch_norm (training)."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    inputs = tf.compat.v1.placeholder(tf.float32, [None, 4, 4, 3])
    estimator_accum.batch_norm(inputs, True, K, momentum=MOMENTUM,
                               epsilon=EPSILON, name="bn")
    with tf.control_dependencies(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
      step = global_step.assign_add(1)
    by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
    moving = [by_name["bn/moving_mean"], by_name["bn/moving_variance"]]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for index in range(micro_batches):
        session.run(step, {inputs: images[index * MICRO_BATCH:
                                          (index + 1) * MICRO_BATCH]})
      return session.run(moving)


def _plain_batch_norm(images, batch_size, momentum):
  """tf.compat.v1.layers.BatchNormalization, one update per batch."""
  with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, [None, 4, 4, 3])
    layer = tf.compat.v1.layers.BatchNormalization(
        momentum=momentum, epsilon=EPSILON, fused=False)
    layer(inputs, training=True)
    update = tf.group(*layer.updates)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for start in range(0, len(images), batch_size):
        session.run(update, {inputs: images[start:start + batch_size]})
      return session.run([layer.moving_mean, layer.moving_variance])


def test_moving_statistics_after_a_window_equal_the_big_batch():
  images = _images()
  actual = _window_statistics(images, K)
  expected = _plain_batch_norm(images, K * MICRO_BATCH, MOMENTUM)
  for got, want in zip(actual, expected, strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # What plain BatchNorm does under accumulation: k updates from
  # micro-batches of B, even with the horizon-adjusted momentum.
  plain = _plain_batch_norm(images, MICRO_BATCH,
                            estimator_accum.adjusted_momentum(MOMENTUM, K))
  assert np.abs(plain[1] - expected[1]).max() > 0.1


def test_moving_statistics_do_not_move_inside_a_window():
  mean, variance = _window_statistics(_images(), K - 1)
  np.testing.assert_array_equal(mean, np.zeros(3))
  np.testing.assert_array_equal(variance, np.ones(3))


def test_adjusted_momentum_and_bad_arguments():
  assert estimator_accum.adjusted_momentum(0.99, 1) == 0.99
  assert abs(estimator_accum.adjusted_momentum(0.81, 2) - 0.9) < 1e-12
  with pytest.raises(ValueError, match="momentum must be in"):
    estimator_accum.adjusted_momentum(1.0, 4)
  with tf.Graph().as_default(), pytest.raises(ValueError, match="k must be"):
    estimator_accum.batch_norm(tf.zeros([2, 3]), True, 0)


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
  with tf.control_dependencies(
      tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(0.01), params["k"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


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
