"""model_fn of a small MNIST CNN built with tf-slim layers.

params:
  k: micro-batches per update (gradient_accumulation_multiplier); 1 trains
    without accumulation through plain `optimizer.minimize`.
  learning_rate: float, for the momentum optimizer.
  micro_batch_size: optional int, for the progress line's examples/sec
    (by default the hook counts the examples each micro-batch holds).
"""

import tensorflow as tf
import tf_slim as slim

import estimator_accum
from models import training


def cnn(images):
  """conv 5x5x16 → pool → conv 5x5x32 → pool → fc 64 → 10 logits.

  LeNet's smooth choices, tanh and average pooling: with ReLU and max
  pooling, the last-bit differences between summing 4 micro-batch means and
  taking one mean of 32 flip pooling choices and grow to 1e-2 within 60
  updates (measured), so accumulated and plain training could not be
  compared weight for weight.
  """
  with slim.arg_scope([slim.conv2d, slim.fully_connected],
                      activation_fn=tf.nn.tanh,
                      weights_initializer=tf.compat.v1.glorot_uniform_initializer(
                          seed=1)):
    net = slim.conv2d(images, 16, [5, 5], scope="conv1")
    net = slim.avg_pool2d(net, [2, 2], scope="pool1")
    net = slim.conv2d(net, 32, [5, 5], scope="conv2")
    net = slim.avg_pool2d(net, [2, 2], scope="pool2")
    net = slim.fully_connected(slim.flatten(net), 64, scope="fc1")
    return slim.fully_connected(net, 10, activation_fn=None, scope="logits")


def model_fn(features, labels, mode, params):
  logits = cnn(features)
  predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
  if mode == estimator_accum.ModeKeys.PREDICT:
    return estimator_accum.EstimatorSpec(mode, predictions={
        "digit": predictions,
        "probabilities": tf.nn.softmax(logits, axis=-1)})
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))
  if mode == estimator_accum.ModeKeys.EVAL:
    accuracy = tf.compat.v1.metrics.accuracy(labels, predictions)
    return estimator_accum.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops={"accuracy": accuracy})
  optimizer = tf.compat.v1.train.MomentumOptimizer(params["learning_rate"],
                                                   0.9)
  return training.train_spec(loss, optimizer, params, log_every=100)


def weight_names():
  return [f"{layer}/{part}" for layer in ("conv1", "conv2", "fc1", "logits")
          for part in ("weights", "biases")]
