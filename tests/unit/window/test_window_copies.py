"""estimator_accum.cast_once_per_window: a weight's bfloat16 (or float16)
operand made once a window from a copy the accumulating train op remakes
after each update, not cast from the float32 variable each micro-batch.
Training is the cast's bit for bit: windows applied and skipped, a resume
mid-window (the copy is made again from the restored weights), every
release; checkpoints hold no copy; a gradient taken through a copy by
anything but the accumulating train op is an error naming the variable;
under a strategy it is the plain cast."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

K, MICRO_BATCH, UPDATES = 4, 8, 3
v1 = tf.compat.v1


def _data(seed=0, rows=K * MICRO_BATCH * UPDATES):
  rng = np.random.RandomState(seed)
  return (rng.normal(size=(rows, 12)).astype(np.float32),
          rng.randint(0, 3, size=rows).astype(np.int32))


def _loss(x, labels, narrow, dtype=tf.bfloat16):
  """Two dense layers with `dtype` products: the kernels' operands by
  `narrow(variable, dtype)`, everything else float32."""
  hidden = v1.get_variable("hidden/kernel", [12, 16],
                           initializer=v1.glorot_uniform_initializer(seed=1))
  bias = v1.get_variable("hidden/bias", [16],
                         initializer=v1.zeros_initializer())
  logits_kernel = v1.get_variable(
      "logits/kernel", [16, 3], initializer=v1.glorot_uniform_initializer(
          seed=2))
  h = tf.tanh(tf.cast(tf.matmul(tf.cast(x, dtype), narrow(hidden, dtype)),
                      tf.float32) + bias)
  logits = tf.cast(tf.matmul(tf.cast(h, dtype), narrow(logits_kernel, dtype)),
                   tf.float32)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


def _cast(variable, dtype):
  return tf.cast(variable, dtype)


def _trained(narrow, optimizer, data, dtype=tf.bfloat16, nan_at=None):
  """Weights after K * UPDATES micro-batches through the library in one
  graph; the graph's variable names."""
  x_all, labels_all = data
  with tf.Graph().as_default() as graph:
    v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, 12])
    labels = v1.placeholder(tf.int32, [None])
    train_op = estimator_accum.build_accumulating_train_op(
        _loss(x, labels, narrow, dtype), optimizer(), K, summaries=False,
        log_every_n_micro_batches=None)
    with v1.Session() as session:
      session.run([v1.global_variables_initializer(),
                   v1.local_variables_initializer()])
      for step in range(K * UPDATES):
        rows = slice(step * MICRO_BATCH, (step + 1) * MICRO_BATCH)
        inputs = x_all[rows].copy()
        if step == nan_at:
          inputs[0, 0] = np.nan
        session.run(train_op, {x: inputs, labels: labels_all[rows]})
      weights = {v.op.name: session.run(v)
                 for v in v1.trainable_variables()}
    names = [v.op.name for v in v1.local_variables()]
  del graph
  return weights, names


OPTIMIZERS = {"sgd": lambda: v1.train.GradientDescentOptimizer(0.5),
              "adam": lambda: v1.train.AdamOptimizer(0.05)}


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16],
                         ids=["bfloat16", "float16"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_is_the_casts_bit_for_bit(optimizer, dtype):
  data = _data()
  expected, plain_names = _trained(_cast, OPTIMIZERS[optimizer], data, dtype)
  actual, names = _trained(estimator_accum.cast_once_per_window,
                           OPTIMIZERS[optimizer], data, dtype)
  support.assert_weights_identical(actual, expected)
  copies = [name for name in names if name not in plain_names]
  assert sorted(copies) == [f"hidden/kernel/{dtype.name}_copy",
                            f"logits/kernel/{dtype.name}_copy"], names
  # Not vacuous: the weights moved in every window.
  start, _ = _trained(_cast, lambda: v1.train.GradientDescentOptimizer(0.0),
                      data, dtype)
  for name in expected:
    assert not np.allclose(expected[name], start[name]), name


def test_a_skipped_window_keeps_its_copy():
  data = _data(seed=1)
  expected, _ = _trained(_cast, OPTIMIZERS["adam"], data, nan_at=K + 1)
  actual, _ = _trained(estimator_accum.cast_once_per_window,
                       OPTIMIZERS["adam"], data, nan_at=K + 1)
  support.assert_weights_identical(actual, expected)


def _model_fn(narrow):
  def model_fn(features, labels, mode):
    loss = _loss(features, labels, narrow)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.train.AdamOptimizer(0.05), K, summaries=False,
        log_every_n_micro_batches=None)
    return estimator_accum.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def _input_fn(data, skip):
  return lambda: (tf.data.Dataset.from_tensor_slices(data).batch(MICRO_BATCH)
                  .skip(skip))


def test_a_resume_mid_window_makes_the_copy_from_the_restored_weights(
    tmp_path):
  data = _data(seed=2)
  weights = {}
  for name, narrow, stops in [
      ("cast", _cast, [K * UPDATES]),
      ("copies", estimator_accum.cast_once_per_window,
       [K + 2, 2 * K + 1, K * UPDATES])]:
    estimator = estimator_accum.Estimator(
        _model_fn(narrow), model_dir=str(tmp_path / name),
        config=estimator_accum.RunConfig(tf_random_seed=0,
                                         log_step_count_steps=1000))
    done = 0
    for stop in stops:  # a new session (and restore) at each stop
      estimator.train(_input_fn(data, done), max_steps=stop)
      done = stop
    weights[name] = {variable: estimator.get_variable_value(variable)
                     for variable in ("hidden/kernel", "hidden/bias",
                                      "logits/kernel")}
    saved = [n for n, _ in tf.train.list_variables(
        estimator.latest_checkpoint())]
    assert not [n for n in saved if "_copy" in n], saved
  support.assert_weights_identical(weights["copies"], weights["cast"])


def test_a_gradient_outside_the_accumulating_train_op_is_an_error():
  with tf.Graph().as_default():
    x = tf.ones([4, 12])
    loss = _loss(x, tf.zeros([4], tf.int32),
                 estimator_accum.cast_once_per_window)
    with pytest.raises(ValueError) as raised:
      v1.train.AdamOptimizer(0.1).minimize(loss)
  said = str(raised.value)
  assert said.startswith(
      "cast_once_per_window: a gradient through logits/kernel's bfloat16 "
      "copy was taken outside an accumulating train op"), said
  assert "build_accumulating_train_op" in said


def test_under_a_strategy_it_is_the_plain_cast():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  with tf.Graph().as_default(), strategy.scope():
    variable = v1.get_variable("w", [3, 3])
    narrow = estimator_accum.cast_once_per_window(variable, tf.bfloat16)
    assert narrow.op.type == "Cast"
    assert not v1.local_variables()


@pytest.mark.parametrize("variable, dtype, said", [
    ("w", tf.int32, "dtype must be a float dtype, got int32"),
    ("w", "nonsense", "dtype must be a float dtype, got 'nonsense'"),
    ("tensor", tf.bfloat16, "variable must be a tf.Variable, got"),
])
def test_bad_arguments_are_named(variable, dtype, said):
  with tf.Graph().as_default():
    value = (v1.get_variable("w", [2]) if variable == "w"
             else tf.ones([2]))
    with pytest.raises(TypeError) as raised:
      estimator_accum.cast_once_per_window(value, dtype)
  assert said in str(raised.value)


def test_the_variables_own_dtype_is_the_variable():
  with tf.Graph().as_default():
    variable = v1.get_variable("w", [2])
    same = estimator_accum.cast_once_per_window(variable, tf.float32)
    assert same.dtype == tf.float32 and not v1.local_variables()
