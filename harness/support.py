"""Shared pieces of the accumulation tests.

`reference_train` is plain TensorFlow big-batch training (`optimizer.minimize`
on a batch of k*B); it does not import estimator_accum. `estimator_train` runs
the same model in a real `tf.estimator.Estimator` whose model_fn calls
`build_accumulating_train_op` on micro-batches of B.

The model has a dense part and an embedding lookup, so every optimizer test
covers both dense gradients and tf.IndexedSlices.
"""

import json

import numpy as np
import tensorflow as tf

import estimator_accum

# Every tf.compat.v1.train optimizer, at settings whose few updates move the
# model's weights well (the exactness tests' table).
_V1 = tf.compat.v1.train
V1_OPTIMIZERS = {
    "sgd": lambda: _V1.GradientDescentOptimizer(0.5),
    "momentum": lambda: _V1.MomentumOptimizer(0.2, 0.9),
    "nesterov": lambda: _V1.MomentumOptimizer(0.2, 0.9, use_nesterov=True),
    "adam": lambda: _V1.AdamOptimizer(0.05),
    "adagrad": lambda: _V1.AdagradOptimizer(0.3),
    "rmsprop": lambda: _V1.RMSPropOptimizer(0.05),
    "rmsprop_centered_momentum": lambda: _V1.RMSPropOptimizer(
        0.05, momentum=0.5, centered=True),
    "adadelta": lambda: _V1.AdadeltaOptimizer(5.0),
    "ftrl": lambda: _V1.FtrlOptimizer(0.3, l1_regularization_strength=0.001,
                                      l2_regularization_strength=0.001),
    "proximal_sgd": lambda: _V1.ProximalGradientDescentOptimizer(
        0.5, l1_regularization_strength=0.001,
        l2_regularization_strength=0.001),
    "proximal_adagrad": lambda: _V1.ProximalAdagradOptimizer(
        0.3, l1_regularization_strength=0.001,
        l2_regularization_strength=0.001),
}

NUM_FEATURES = 5
HIDDEN = 7
NUM_CLASSES = 3
VOCAB = 40
IDS_PER_EXAMPLE = 3
EMBED = 4


def make_data(num_examples, seed=0):
  """Returns a dict of numpy arrays: features x, ids, and labels."""
  rng = np.random.RandomState(seed)
  return {
      "x": rng.normal(size=(num_examples, NUM_FEATURES)).astype(np.float32),
      # Ids from the first half of the vocabulary only: the other rows never
      # get a gradient, and some rows of the first half miss whole windows.
      "ids": rng.randint(0, VOCAB // 2,
                         size=(num_examples, IDS_PER_EXAMPLE)).astype(np.int32),
      "labels": rng.randint(0, NUM_CLASSES, size=num_examples).astype(np.int32),
  }


def initial_weights(seed=1):
  rng = np.random.RandomState(seed)
  return {
      "embedding": rng.normal(scale=0.5, size=(VOCAB, EMBED)),
      "dense/kernel": rng.normal(scale=0.5, size=(NUM_FEATURES + EMBED,
                                                  HIDDEN)),
      "dense/bias": rng.normal(scale=0.1, size=(HIDDEN,)),
      "logits/kernel": rng.normal(scale=0.5, size=(HIDDEN, NUM_CLASSES)),
      "logits/bias": np.zeros(NUM_CLASSES),
  }


def _partitioned_variable(name, value, partitions):
  """A variable split in `partitions` along its rows, as parameter-server
  jobs split large embeddings; it starts at `value` like the others."""

  def initializer(shape, dtype=tf.float32, partition_info=None):
    start = partition_info.var_offset[0] if partition_info else 0
    return tf.constant(value[start:start + shape[0]], dtype)

  return tf.compat.v1.get_variable(
      name, value.shape, tf.float32, initializer=initializer,
      partitioner=tf.compat.v1.fixed_size_partitioner(partitions))


def model_loss(features, labels, reduction="mean", compute_dtype=tf.float32,
               embedding_partitions=None, recompute=False):
  """Builds the model with tf.compat.v1.get_variable; returns the loss.

  With compute_dtype float16 or bfloat16 the variables stay float32 and are
  cast for the forward pass (mixed precision); the loss is float32. With
  embedding_partitions the embedding is a PartitionedVariable of that many
  parts. With recompute the hidden layer is an `estimator_accum.recompute`
  block (the embedding's sparse gradient stays outside it).
  """
  weights = {
      name: tf.compat.v1.get_variable(
          name, initializer=tf.constant(value, tf.float32))
      for name, value in initial_weights().items()
      if not (name == "embedding" and embedding_partitions)
  }
  if embedding_partitions:
    weights["embedding"] = _partitioned_variable(
        "embedding", initial_weights()["embedding"], embedding_partitions)
  weights = {name: value if name == "embedding" and embedding_partitions
             else tf.cast(value, compute_dtype)
             for name, value in weights.items()}
  embedded = tf.cast(tf.reduce_mean(
      tf.nn.embedding_lookup(weights["embedding"], features["ids"]), axis=1),
                     compute_dtype)
  inputs = tf.concat([tf.cast(features["x"], compute_dtype), embedded], axis=1)

  def hidden_layer(inputs):
    return tf.tanh(tf.matmul(inputs, weights["dense/kernel"]) +
                   weights["dense/bias"])

  if recompute:
    hidden_layer = estimator_accum.recompute(hidden_layer)
  hidden = hidden_layer(inputs)
  logits = tf.matmul(hidden, weights["logits/kernel"]) + weights["logits/bias"]
  per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=tf.cast(logits, tf.float32))
  if reduction == "sum":
    return tf.reduce_sum(per_example)
  if reduction == "tokens":
    # A sequence model's mean over its real (unpadded) tokens: example i
    # stands for features["tokens"][i] tokens sharing its loss.
    tokens = tf.cast(features["tokens"], tf.float32)
    return tf.reduce_sum(per_example * tokens) / tf.reduce_sum(tokens)
  return tf.reduce_mean(per_example)


def weight_names():
  return list(initial_weights())


def reference_train(optimizer_fn, data, batch_size, steps, clip_norm=None,
                    loss_reduction="mean", minimize=True,
                    embedding_partitions=None, ema_decay=None,
                    unique_rows=False, compute_dtype=tf.float32):
  """Plain big-batch training in a fresh graph; returns the final weights.

  Args:
    optimizer_fn: callable returning a fresh optimizer.
    data: dict from make_data; batches are taken in order.
    batch_size: the big batch, k*B; or a list, the sizes of the successive
      batches.
    steps: number of updates.
    clip_norm: if set, gradients are clipped by global norm before applying.
    loss_reduction: "mean" or "sum" over the batch.
    minimize: use optimizer.minimize(loss, global_step); False uses
      tf.gradients + apply_gradients (Keras legacy, BERT AdamWeightDecay).
    embedding_partitions: None, or the number of parts of the embedding
      (its parts are returned joined, under the variable's name).
    ema_decay: None, or the decay of an ExponentialMovingAverage of the
      weights (num_updates = global step) run after every step, as recipes
      do; its averages are returned too, as "<name>/ExponentialMovingAverage".
    unique_rows: hand the optimizer the embedding's gradient with its
      duplicate rows summed (as a dense tensor), the gradient itself: an
      optimizer that clips raw tf.IndexedSlices (Keras clipvalue, clipnorm)
      clips each occurrence of a row on its own instead. Implies
      minimize=False.
    compute_dtype: the forward pass's dtype (model_loss's: float32
      variables cast for it), e.g. tf.bfloat16.
  """
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    placeholders = {
        key: tf.compat.v1.placeholder(tf.as_dtype(value.dtype),
                                      (None,) + value.shape[1:])
        for key, value in data.items()}
    loss = model_loss(placeholders, placeholders["labels"], loss_reduction,
                      compute_dtype=compute_dtype,
                      embedding_partitions=embedding_partitions)
    optimizer = optimizer_fn()
    variables = tf.compat.v1.trainable_variables()
    if minimize and clip_norm is None and not unique_rows:
      train_op = optimizer.minimize(loss, global_step=global_step)
    else:
      gradients = tf.compat.v1.gradients(loss, variables)
      if unique_rows:
        gradients = [tf.convert_to_tensor(g) for g in gradients]
      if clip_norm is not None:
        # The norm of the gradient itself: tf.linalg.global_norm on raw
        # IndexedSlices counts a row once per duplicate index instead.
        norm = tf.linalg.global_norm(
            [tf.convert_to_tensor(g) for g in gradients])
        gradients, _ = tf.clip_by_global_norm(gradients, clip_norm,
                                              use_norm=norm)
      apply = optimizer.apply_gradients(list(zip(gradients, variables)))
      with tf.control_dependencies([apply]):
        train_op = global_step.assign_add(1)
    averages = []
    if ema_decay is not None:
      ema = tf.compat.v1.train.ExponentialMovingAverage(
          ema_decay, num_updates=global_step)
      with tf.control_dependencies([train_op]):
        train_op = ema.apply(variables)
      averages = [ema.average(v) for v in variables]
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      sizes = (batch_size if isinstance(batch_size, (list, tuple))
               else [batch_size] * steps)
      assert len(sizes) == steps, (sizes, steps)
      start = 0
      for size in sizes:
        batch = slice(start, start + size)
        start += size
        feed = {placeholders[key]: value[batch] for key, value in data.items()}
        session.run(train_op, feed)
      values = {v.op.name: session.run(v) for v in variables + averages}
  parts = sorted((name for name in values if "/part_" in name),
                 key=lambda name: int(name.rsplit("_", 1)[1]))
  if parts:
    values["embedding"] = np.concatenate([values.pop(n) for n in parts])
  return values


def reference_gradient_norm(data, batch_size):
  """Global norm of the first big batch's gradient at the initial weights."""
  graph = tf.Graph()
  with graph.as_default():
    features = {key: tf.constant(value[:batch_size])
                for key, value in data.items()}
    loss = model_loss(features, features["labels"])
    gradients = tf.compat.v1.gradients(loss,
                                       tf.compat.v1.trainable_variables())
    norm = tf.linalg.global_norm([tf.convert_to_tensor(g) for g in gradients])
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(norm)


def reference_batch_norm(values, batch_sizes, momentum, epsilon=1e-3):
  """Plain TensorFlow's BatchNorm (tf.compat.v1.layers, not fused): one
  update per batch of `batch_sizes` (example counts, in order) of `values`
  (float32 [N, ...]); returns [moving_mean, moving_variance]."""
  with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, (None,) + values.shape[1:])
    layer = tf.compat.v1.layers.BatchNormalization(
        momentum=momentum, epsilon=epsilon, fused=False)
    layer(inputs, training=True)
    update = tf.group(*layer.updates)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      run_in_order(session, update, inputs, values, batch_sizes)
      return session.run([layer.moving_mean, layer.moving_variance])


def run_in_order(session, fetch, inputs, values, batch_sizes):
  """Runs `fetch` once per batch of `batch_sizes` (example counts), feeding
  the placeholder `inputs` the next that many rows of `values`."""
  start = 0
  for size in batch_sizes:
    session.run(fetch, {inputs: values[start:start + size]})
    start += size


MICRO_BATCH_LOSS = "test_micro_batch_loss"


class LossRecorder(tf.compat.v1.train.SessionRunHook):
  """Writes the micro-batch loss of every step (this replica's, from
  accumulating_model_fn) to `output_path` as JSON at the end; Estimator
  deep-copies the hooks in its params, as with CollectiveCounter."""

  def __init__(self, output_path):
    self._output_path = output_path
    self._losses = []
    self._loss = None

  def begin(self):
    self._loss = tf.compat.v1.get_collection(MICRO_BATCH_LOSS)[0]

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    del run_context
    self._losses.append(float(run_values.results))

  def end(self, session):
    del session
    with open(self._output_path, "w") as writer:
      json.dump(self._losses, writer)


def accumulating_model_fn(features, labels, mode, params):
  """model_fn: the test model trained with build_accumulating_train_op.

  With params["batch_norm_momentum"], an `estimator_accum.batch_norm` layer
  `bn` (no gamma or beta) also sees features["x"]: its output is not used,
  its moving statistics are updated by the train op.
  """
  loss = model_loss(features, labels, params.get("loss_reduction", "mean"),
                    params.get("compute_dtype", tf.float32),
                    params.get("embedding_partitions"),
                    params.get("recompute", False))
  if params.get("batch_norm_momentum") is not None:
    estimator_accum.batch_norm(
        features["x"], mode == tf.estimator.ModeKeys.TRAIN, params["k"],
        momentum=params["batch_norm_momentum"], center=False, scale=False,
        name="bn")
  loss *= params.get("loss_multiplier", 1.0)
  num_examples = None
  communication_options = None
  if params.get("bytes_per_pack") is not None:
    communication_options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=params["bytes_per_pack"])
  if params.get("weight_by_examples"):
    num_examples = tf.shape(labels)[0]
  if params.get("weight_by_tokens"):
    num_examples = tf.reduce_sum(features["tokens"])
  after_update = None
  if params.get("ema_decay") is not None:
    variables = tf.compat.v1.trainable_variables()

    def after_update():
      # The count is read here, after this update, as the recipe reads its
      # global step after its train op.
      return tf.compat.v1.train.ExponentialMovingAverage(
          params["ema_decay"],
          num_updates=estimator_accum.update_count(params["k"])).apply(
              variables)
  reported = None
  if params.get("reportable_loss") == "first":
    reported = estimator_accum.reportable_loss(loss)
  train_op = estimator_accum.build_accumulating_train_op(
      loss, params["optimizer_fn"](), params["k"], after_update=after_update,
      clip_norm=params.get("clip_norm"), num_examples=num_examples,
      reduction=params.get("reduction", "mean"),
      loss_scale=params.get("loss_scale"),
      sparse_accumulation=params.get("sparse_accumulation", "auto"),
      accumulator_dtype=params.get("accumulator_dtype", tf.float32),
      accumulator_placement=params.get("accumulator_placement", "device"),
      communication_options=communication_options,
      table_all_reduce=params.get("table_all_reduce", "auto"),
      communication_dtype=params.get("communication_dtype"),
      fused_apply=params.get("fused_apply", False),
      log_every_n_micro_batches=params.get("log_every", 100))
  hooks = list(params.get("training_hooks", []))
  # The micro-batch's own loss, for hooks that record it (LossRecorder).
  tf.compat.v1.add_to_collection(MICRO_BATCH_LOSS, loss)
  if reported is not None:
    loss = reported
  elif params.get("reportable_loss"):
    loss = estimator_accum.reportable_loss(
        loss, across_workers=params["reportable_loss"] == "across_workers")
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_hooks=hooks)


# Not converted by autograph (its control flow is Python's, on params):
# Estimator converts a model_fn under a strategy in every worker, 0.3 s of
# CPU here; the BERT and MNIST jobs' model_fns are still converted, as
# users' are. Marked as autograph marks what it must call as it is (the
# attribute `is_autograph_artifact` looks for), not wrapped: a wrapper's
# (*args, **kwargs) is not a model_fn's signature to Estimator. Where
# TensorFlow looks for no such mark, it is converted, as before.
accumulating_model_fn.autograph_info__ = {}


def micro_batch_input_fn(data, batch_size, skip=0):
  """Input fn yielding micro-batches of `batch_size` in order, once."""

  def input_fn():
    features = {key: value for key, value in data.items() if key != "labels"}
    dataset = tf.data.Dataset.from_tensor_slices((features, data["labels"]))
    return dataset.batch(batch_size).skip(skip)

  return input_fn


def make_estimator(model_dir, params, save_checkpoints_steps=None,
                   keep_checkpoint_max=5, train_distribute=None,
                   summary_steps=None):
  """An Estimator of `accumulating_model_fn`. Without `summary_steps` it
  writes no summaries and no graph beside its checkpoints: TensorFlow then
  optimizes (Grappler) the training graph once, not also for the first
  step's summaries, and prints no graph.pbtxt (about 8% of a test's CPU)."""
  device_count = {}
  if train_distribute is not None:
    # Graph sessions see one CPU unless told: without this, Estimator's
    # session hangs on ops placed on the second logical CPU.
    device_count = {"CPU": train_distribute.num_replicas_in_sync}
  config = tf.estimator.RunConfig(
      model_dir=str(model_dir), tf_random_seed=0,
      train_distribute=train_distribute,
      save_checkpoints_steps=save_checkpoints_steps,
      save_checkpoints_secs=None if save_checkpoints_steps else 10_000,
      keep_checkpoint_max=keep_checkpoint_max,
      log_step_count_steps=1_000_000, save_summary_steps=summary_steps,
      checkpoint_save_graph_def=False,
      session_config=estimator_accum.own_threads(tf.compat.v1.ConfigProto(
          device_count=device_count, intra_op_parallelism_threads=1,
          inter_op_parallelism_threads=1 if train_distribute is None else 0)))
  return tf.estimator.Estimator(accumulating_model_fn, config=config,
                                params=params)


def estimator_train(model_dir, optimizer_fn, data, micro_batch, k,
                    micro_batches, train_distribute=None, summary_steps=None,
                    **params):
  """Trains in a real Estimator; returns (estimator, final weights).

  Under a strategy with R replicas, each micro-batch step takes R
  consecutive batches of `micro_batch` (one per replica), so step j covers
  the same examples as the reference's slice j of R * micro_batch.
  """
  estimator = make_estimator(
      model_dir, dict(params, optimizer_fn=optimizer_fn, k=k),
      train_distribute=train_distribute, summary_steps=summary_steps)
  estimator.train(micro_batch_input_fn(data, micro_batch),
                  max_steps=micro_batches)
  return estimator, {name: estimator.get_variable_value(name)
                     for name in weight_names()}


def relative_distance(actual, expected):
  """||actual - expected|| / ||expected|| over every tensor at once (dicts
  by name, or sequences in order): one figure for how far a run's weights
  are from another's, which a single entry's rounding does not decide."""
  pairs = ([(actual[name], expected[name]) for name in expected]
           if isinstance(expected, dict) else list(zip(actual, expected)))
  return float(np.sqrt(sum(np.sum((np.asarray(a) - np.asarray(e)) ** 2)
                           for a, e in pairs)) /
               np.sqrt(sum(np.sum(np.asarray(e) ** 2) for _, e in pairs)))


def assert_weights_close(actual, expected, rtol=1e-5, atol=1e-6, what=""):
  """Asserts two weight dicts agree, naming the variable and the worst error."""
  assert set(actual) == set(expected), (sorted(actual), sorted(expected))
  for name in sorted(expected):
    np.testing.assert_allclose(
        actual[name], expected[name], rtol=rtol, atol=atol,
        err_msg=f"{what}: variable {name} differs from big-batch training")


def assert_weights_identical(actual, expected, what=""):
  """Asserts two weight dicts are the same bit for bit (float32 compared
  as their bits: -0.0 is not 0.0, a NaN equals its own bits)."""
  assert set(actual) == set(expected), (sorted(actual), sorted(expected))
  for name in sorted(expected):
    np.testing.assert_array_equal(
        np.asarray(actual[name]).view(np.uint32),
        np.asarray(expected[name]).view(np.uint32),
        err_msg=f"{what}: variable {name} differs")


def assert_trained_like_big_batch(estimator, actual, expected, micro_batches,
                                  updates, what):
  """The accumulating run moved every weight, matches the big batch, and
  counted its micro-batches and updates."""
  assert_weights_moved(actual, what)
  assert_weights_close(actual, expected, what=what)
  assert estimator.get_variable_value("global_step") == micro_batches
  assert estimator.get_variable_value(
      "gradient_accumulation/updates_applied") == updates


def assert_weights_moved(actual, what=""):
  """Guards against a vacuous comparison: training must move the weights."""
  start = initial_weights()
  moved = [n for n in actual if not np.allclose(actual[n], start[n])]
  assert len(moved) == len(actual), f"{what}: weights that never moved: " + str(
      sorted(set(actual) - set(moved)))


def depends_on(op, ancestors):
  """Whether graph op `op` depends (through data or control inputs) on one
  of the ops in `ancestors`."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    if current in ancestors:
      return True
    if current in seen:
      continue
    seen.add(current)
    stack.extend(t.op for t in current.inputs)
    stack.extend(current.control_inputs)
  return False


def load_variables(session, values):
  """Writes `values` ({variable: array}) into the session's variables in one
  run (its ops made in the session's graph, whatever the default one). A
  run per variable (`variable.load`) builds and optimizes a new executor
  for each, which took most of some tests' time."""
  with session.graph.as_default():
    placeholders = {variable: tf.compat.v1.placeholder(
        variable.dtype.base_dtype, variable.shape) for variable in values}
    load = tf.group([variable.assign(placeholder)
                     for variable, placeholder in placeholders.items()])
  session.run(load, {placeholders[variable]: value
                     for variable, value in values.items()})
