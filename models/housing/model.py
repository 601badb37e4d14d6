"""model_fn of a linear regressor of housing prices.

params:
  k: micro-batches per update (gradient_accumulation_multiplier); 1 trains
    without accumulation through plain `optimizer.minimize`.
  learning_rate: float.
  micro_batch_size: optional int, for the progress line's examples/sec
    (by default the hook counts the examples each micro-batch holds).
"""

import tensorflow as tf

import estimator_accum
from models import training

NUM_FEATURES = 13


def model_fn(features, labels, mode, params):
  """A linear regressor, y = x·w + b, with squared-error loss."""
  weights = tf.compat.v1.get_variable(
      "linear/kernel", [NUM_FEATURES, 1],
      initializer=tf.compat.v1.zeros_initializer())
  bias = tf.compat.v1.get_variable(
      "linear/bias", [1], initializer=tf.compat.v1.constant_initializer(22.0))
  predictions = tf.squeeze(tf.matmul(features, weights) + bias, axis=1)
  if mode == estimator_accum.ModeKeys.PREDICT:
    return estimator_accum.EstimatorSpec(mode, predictions={"price": predictions})
  loss = tf.reduce_mean(tf.square(predictions - labels))
  if mode == estimator_accum.ModeKeys.EVAL:
    rmse = tf.compat.v1.metrics.root_mean_squared_error(labels, predictions)
    return estimator_accum.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops={"rmse": rmse})
  optimizer = tf.compat.v1.train.MomentumOptimizer(params["learning_rate"],
                                                   0.9)
  return training.train_spec(loss, optimizer, params)
