"""The model of the recipe comparison: an embedding (sparse gradients) and a
dense layer, its data, and plain big-batch training as the reference."""

import numpy as np
import tensorflow as tf

import estimator_accum
from benchmarks.public_recipe import recipe_train_op

VOCAB, EMBED, FEATURES, HIDDEN, CLASSES = 30522, 64, 32, 256, 4
WEIGHTS = ("embedding", "dense/kernel", "dense/bias", "logits/kernel")


def make_data(count, seed=0):
  rng = np.random.RandomState(seed)
  return {"x": rng.normal(size=(count, FEATURES)).astype(np.float32),
          "ids": rng.randint(0, VOCAB, size=(count, 8)).astype(np.int32),
          "labels": rng.randint(0, CLASSES, size=count).astype(np.int32)}


def loss_fn(features, labels):
  rng = np.random.RandomState(1)

  def weight(name, shape, scale):
    return tf.compat.v1.get_variable(name, initializer=tf.constant(
        rng.normal(scale=scale, size=shape).astype(np.float32)))

  embedding = weight("embedding", (VOCAB, EMBED), 0.1)
  kernel = weight("dense/kernel", (FEATURES + EMBED, HIDDEN), 0.1)
  bias = weight("dense/bias", (HIDDEN,), 0.0)
  logits_kernel = weight("logits/kernel", (HIDDEN, CLASSES), 0.1)
  embedded = tf.reduce_mean(tf.nn.embedding_lookup(embedding,
                                                   features["ids"]), 1)
  hidden = tf.tanh(tf.matmul(tf.concat([features["x"], embedded], 1), kernel)
                   + bias)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=tf.matmul(hidden, logits_kernel)))


def optimizer():
  return tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)


def model_fn(features, labels, mode, params):
  loss = loss_fn(features, labels)
  if params["variant"] == "recipe":
    train_op = recipe_train_op(loss, optimizer(), params["k"])
  else:
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimizer(), params["k"], summaries=False)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_hooks=params.get("hooks", []))


def reference_weights(data, batch, updates):
  """Plain big-batch training on one device."""
  with tf.Graph().as_default():
    features = {key: tf.compat.v1.placeholder(
        tf.as_dtype(value.dtype), (None,) + value.shape[1:])
        for key, value in data.items()}
    loss = loss_fn(features, features["labels"])
    train_op = optimizer().minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(updates):
        part = slice(step * batch, (step + 1) * batch)
        session.run(train_op, {features[key]: value[part]
                               for key, value in data.items()})
      by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
      return {name: session.run(by_name[name]) for name in WEIGHTS}


def relative_error(actual, expected):
  """Largest |a - b| over each tensor's largest |b|, across tensors."""
  return max(float(np.max(np.abs(actual[n] - expected[n])) /
                   np.max(np.abs(expected[n]))) for n in expected)
