"""A model whose memory grows with the micro-batch, for the planner's tests.

Each example's 16 inputs go through a ReLU layer of 256 units, and the
outer product of those units with themselves (256 x 256 float32, 256 KB
per example) is averaged into the logits. The step holds that product and
its gradients: about 0.75 MB per example against 20 KB of weights, so the
peak of tensor memory is far apart from one candidate micro-batch to the
next, and the same from one measurement to the next. Every weight's
gradient sums over the batch only, so float32 agrees with the big batch to
rounding. Examples are drawn in the input pipeline from their index, so
any batching gives the same examples. `reference_train` is plain
TensorFlow on the big batch, from the same initial weights.
"""

import re

import numpy as np
import tensorflow as tf

import estimator_accum

WIDTH = 16
HIDDEN = 256
NUM_CLASSES = 3
LEARNING_RATE = 0.1
WEIGHT_NAMES = ("hidden/kernel", "out/kernel", "out/bias")
EXAMPLE_BYTES = HIDDEN * HIDDEN * 4


def make_data(num_examples, ballast_from=None, ballast_floats=0):
  """The examples' description. From example `ballast_from` on, each also
  carries `ballast_floats` zeros that the loss adds times 0: memory that
  training holds and the weights never see (a batch of longer sequences)."""
  return {"num_examples": num_examples, "ballast_from": ballast_from,
          "ballast_floats": ballast_floats}


def examples(data):
  """Dataset of ({"x", "ballast"}, label): example i is drawn from seed i."""

  def example(index):
    x = tf.random.stateless_normal([WIDTH], seed=tf.stack([index, 0]))
    label = tf.random.stateless_uniform([], seed=tf.stack([index, 1]),
                                        maxval=NUM_CLASSES, dtype=tf.int32)
    floats = 0
    if data.get("ballast_from") is not None:
      floats = tf.where(index >= data["ballast_from"],
                        tf.constant(data["ballast_floats"], tf.int64),
                        tf.constant(1, tf.int64))
    return {"x": x, "ballast": tf.zeros(tf.reshape(floats, [-1]))}, label

  return tf.data.Dataset.range(data["num_examples"]).map(example)


def _initial(seed=1):
  rng = np.random.RandomState(seed)
  return {"hidden/kernel": rng.randn(WIDTH, HIDDEN).astype(np.float32) * .3,
          "out/kernel": rng.randn(HIDDEN, NUM_CLASSES).astype(np.float32) * .3,
          "out/bias": np.zeros(NUM_CLASSES, np.float32)}


def loss_of(features, labels):
  x = features["x"]
  ballast = 0.0 * tf.reduce_sum(features["ballast"])
  init = {name: tf.compat.v1.constant_initializer(value)
          for name, value in _initial().items()}
  hidden = tf.compat.v1.layers.dense(
      x, HIDDEN, tf.nn.relu, use_bias=False, name="hidden",
      kernel_initializer=init["hidden/kernel"])
  # Each example's outer product: 256 KB of activations, and its gradient.
  outer = hidden[:, :, None] * hidden[:, None, :]
  pooled = tf.reduce_mean(outer, axis=2)
  logits = tf.compat.v1.layers.dense(
      pooled, NUM_CLASSES, name="out", kernel_initializer=init["out/kernel"],
      bias_initializer=init["out/bias"])
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits)) + ballast


def _optimizer():
  return tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, 0.9)


def model_fn(features, labels, mode, params):
  """Accumulating model_fn: params["k"]; with params["weight_by_examples"]
  the window weighs each micro-batch by its examples (uneven plans)."""
  loss = loss_of(features, labels)
  num_examples = (tf.shape(labels)[0] if params.get("weight_by_examples")
                  else None)
  train_op = estimator_accum.build_accumulating_train_op(
      loss, _optimizer(), params["k"],
      num_examples=num_examples)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn_for(data, skip=0):
  """input_fn(params): micro-batches of params["batch_size"] in order;
  with params["plan"] (uneven), in the plan's windows."""

  def input_fn(params):
    dataset = examples(data)
    if params.get("plan") is not None:
      dataset = estimator_accum.window_batches(dataset, params["plan"])
    else:
      dataset = dataset.batch(params["batch_size"])
    return dataset.skip(skip)

  return input_fn


def estimator_train(model_dir, data, plan, uneven=False):
  """Trains every window of `data` with `plan`; returns the weights.
  `uneven`: the input in the plan's windows, weighted by examples."""
  params = dict(plan=plan, weight_by_examples=True) if uneven else {}
  config = tf.estimator.RunConfig(
      model_dir=str(model_dir), tf_random_seed=0, log_step_count_steps=10**6,
      session_config=estimator_accum.own_threads(tf.compat.v1.ConfigProto(
          intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)))
  estimator = tf.estimator.Estimator(
      model_fn, config=config,
      params=dict(params, k=plan.k, batch_size=plan.micro_batch))
  updates = data["num_examples"] // plan.effective_batch
  estimator.train(input_fn_for(data), max_steps=updates * plan.k)
  return {name: estimator.get_variable_value(name) for name in WEIGHT_NAMES}


def reference_train(data, batch_size, steps=None):
  """Plain momentum on batches of `batch_size` in order (every whole one,
  or `steps`); the final weights."""
  steps = data["num_examples"] // batch_size if steps is None else steps
  graph = tf.Graph()
  with graph.as_default():
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        examples(dict(data, ballast_from=None)).batch(batch_size)).get_next()
    train = _optimizer().minimize(loss_of(features, labels))
    init = tf.compat.v1.global_variables_initializer()
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(init)
    for _ in range(steps):
      session.run(train)
    return session.run({name: variables[name] for name in WEIGHT_NAMES})


def refused_plan_peaks_mb(result):
  """{micro-batch: peak MB} of the plain candidates a script's planner
  printed ("measured micro-batch M (k=K): P MB") before refusing a budget
  none of them fits (`result`: its CompletedProcess)."""
  assert result.returncode != 0
  assert "even micro-batch 1 needs" in result.stderr, result.stderr[-2000:]
  return {int(m): float(mb) for m, mb in re.findall(
      r"measured micro-batch (\d+) \(k=\d+\): ([\d.]+) MB", result.stdout)}
