"""Bad input raises TypeError/ValueError naming the argument and the value."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum


def _build(**overrides):
  graph = tf.Graph()
  with graph.as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    arguments = dict(loss=tf.reduce_sum(w * 2.0),
                     optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1),
                     k=4)
    arguments.update({key: value(w) if callable(value) else value
                      for key, value in overrides.items()})
    return estimator_accum.build_accumulating_train_op(
        arguments.pop("loss"), arguments.pop("optimizer"), arguments.pop("k"),
        **arguments)


@pytest.mark.parametrize("k, error, text", [
    (0, ValueError, "k must be >= 1 (micro-batches per update), got 0"),
    (-3, ValueError, "got -3"),
    (2.5, TypeError, "k must be a Python int (the number of micro-batches "
     "per update), got 2.5 of type float"),
    ("4", TypeError, "got '4' of type str"),
    (True, TypeError, "got True of type bool"),
    (None, TypeError, "got None"),
])
def test_bad_k(k, error, text):
  with pytest.raises(error) as raised:
    _build(k=k)
  assert text in str(raised.value)


def test_eager_call_is_refused():
  with pytest.raises(RuntimeError, match="builds a tf.compat.v1 graph"):
    estimator_accum.build_accumulating_train_op(
        tf.constant(1.0), tf.compat.v1.train.AdamOptimizer(), 2)


def test_call_inside_a_tf_function_is_refused():
  """A tf.function traces a graph of its own, run as one call: the window
  could not persist across micro-batches there."""
  variable = tf.Variable(1.0)

  @tf.function
  def step():
    return estimator_accum.build_accumulating_train_op(
        variable * 2.0, tf.compat.v1.train.AdamOptimizer(), 2)

  with pytest.raises(RuntimeError, match="called inside a tf.function"):
    step()


def test_non_scalar_loss():
  with pytest.raises(ValueError, match=r"loss must be a scalar \(rank 0\), "
                     r"got shape \(3,\)"):
    _build(loss=lambda w: w * 2.0)


def test_integer_loss():
  with pytest.raises(TypeError, match="loss must have a floating-point dtype, "
                     "got int32"):
    _build(loss=lambda w: tf.constant(1))


def test_loss_that_is_not_a_tensor():
  with pytest.raises(TypeError, match="loss must be a scalar floating-point "
                     "tf.Tensor, got 1.5 of type float"):
    _build(loss=1.5)


def test_loss_with_no_trainable_variable_reachable():
  with pytest.raises(ValueError, match="has no gradient with respect to any "
                     "of the 1 trainable variables"):
    _build(loss=lambda w: tf.reduce_sum(tf.stop_gradient(w)) + 1.0)


def test_loss_of_unknown_rank_is_checked_when_it_runs():
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
    # Axes known only when it runs: the sum's rank is unknown.
    axes = tf.compat.v1.placeholder_with_default([0], shape=[None])
    loss = tf.reduce_sum(w * w, axis=axes)
    assert loss.shape.rank is None
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"loss Sum:0 must be a scalar \(rank 0\)"):
        session.run(train_op, {axes: []})


def test_var_list_the_loss_does_not_reach():
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
    other = tf.compat.v1.get_variable("other", initializer=1.0,
                                      trainable=False)
    with pytest.raises(ValueError, match="has no gradient with respect to any "
                       "of the 1 variables in var_list"):
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w), tf.compat.v1.train.GradientDescentOptimizer(0.1),
          2, var_list=[other])


def test_graph_without_trainable_variables():
  graph = tf.Graph()
  with graph.as_default():
    loss = tf.constant(1.0) * 2.0
    with pytest.raises(ValueError, match="the graph has no trainable"):
      estimator_accum.build_accumulating_train_op(
          loss, tf.compat.v1.train.AdamOptimizer(), 2)


@pytest.mark.parametrize("optimizer, text", [
    ("adam", "got 'adam' of type str"),
    (lambda w: object(), "of type object"),
    (tf.keras.optimizers.Adam(), "Keras optimizer of the new kind"),
])
def test_not_an_optimizer(optimizer, text):
  with pytest.raises(TypeError) as raised:
    _build(optimizer=optimizer)
  assert "optimizer" in str(raised.value) and text in str(raised.value)


@pytest.mark.parametrize("clip_norm, error, text", [
    (0.0, ValueError, "clip_norm must be a finite number > 0 or None, got 0.0"),
    (-1, ValueError, "got -1"),
    (float("inf"), ValueError, "got inf"),
    ("1", TypeError, "got '1' of type str"),
])
def test_bad_clip_norm(clip_norm, error, text):
  with pytest.raises(error) as raised:
    _build(clip_norm=clip_norm)
  assert text in str(raised.value)


@pytest.mark.parametrize("options, text", [
    ({"bytes_per_pack": 4}, "got {'bytes_per_pack': 4} of type dict"),
    (4194304, "got 4194304 of type int"),
])
def test_bad_communication_options(options, text):
  with pytest.raises(TypeError) as raised:
    _build(communication_options=options)
  assert ("communication_options must be a "
          "tf.distribute.experimental.CommunicationOptions or None") in str(
              raised.value)
  assert text in str(raised.value)


def test_communication_options_are_accepted():
  options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1)
  assert isinstance(_build(communication_options=options), tf.Operation)


def test_bad_reduction():
  with pytest.raises(ValueError, match="reduction must be one of mean, sum, "
                     "running_mean, got 'avg'"):
    _build(reduction="avg")


def test_sum_with_num_examples_conflicts():
  with pytest.raises(ValueError, match="num_examples .* reduction='sum'"):
    _build(reduction="sum", num_examples=lambda w: tf.constant(4))


def test_non_scalar_num_examples():
  with pytest.raises(ValueError, match=r"num_examples must be a scalar"):
    _build(num_examples=lambda w: tf.constant([4, 4]))


def test_bad_accumulator_dtype():
  with pytest.raises(TypeError, match="accumulator_dtype must be a "
                     "floating-point dtype, got int32"):
    _build(accumulator_dtype=tf.int32)


def test_bad_var_list():
  with pytest.raises(TypeError, match=r"var_list\[0\] must be a tf.Variable, "
                     "got 'w'"):
    _build(var_list=["w"])
  with pytest.raises(ValueError, match=r"var_list holds w:0 twice "
                     r"\(var_list\[0\] and var_list\[1\]\)"):
    _build(var_list=lambda w: [w, w])


def _int64_variable(shape):
  return lambda w: tf.compat.v1.get_variable(
      "micro_batches", shape, tf.int64, trainable=False,
      initializer=tf.compat.v1.zeros_initializer())


@pytest.mark.parametrize("global_step, error, text", [
    (lambda w: tf.constant(0, tf.int64), TypeError,
     "global_step must be a scalar integer tf.Variable (it is incremented "
     "every micro-batch) or None, got <tf.Tensor 'Const"),
    (7, TypeError, "got 7 of type int"),
    (lambda w: tf.compat.v1.get_variable("step", [], tf.float32,
                                         trainable=False), TypeError,
     "global_step must be an integer variable, got dtype float32 for step:0"),
    (_int64_variable([2]), ValueError,
     "global_step must be a scalar (rank 0), got shape (2,) for "
     "micro_batches:0"),
])
def test_bad_global_step(global_step, error, text):
  with pytest.raises(error) as raised:
    _build(global_step=global_step)
  assert text in str(raised.value)


def test_own_global_step_is_accepted():
  assert isinstance(_build(global_step=_int64_variable([])), tf.Operation)


@pytest.mark.parametrize("overrides, error, text", [
    (dict(name=""), ValueError, "name must be a non-empty scope name"),
    (dict(name="_accum"), ValueError, "got '_accum'"),
    (dict(name="accum/"), ValueError, "got 'accum/'"),
    (dict(name=3), TypeError, "name must be a str, got 3 of type int"),
    (dict(summaries="no"), TypeError,
     "summaries must be True or False, got 'no' of type str"),
    (dict(colocate_gradients_with_ops=1), TypeError,
     "colocate_gradients_with_ops must be True or False, got 1 of type int"),
    (dict(log_every_n_micro_batches=0), ValueError,
     "log_every_n_micro_batches must be >= 1, or None for no progress line, "
     "got 0"),
    (dict(log_every_n_micro_batches=2.5), TypeError,
     "log_every_n_micro_batches must be an int, or None for no progress "
     "line, got 2.5 of type float"),
])
def test_bad_name_and_flags(overrides, error, text):
  with pytest.raises(error) as raised:
    _build(**overrides)
  assert text in str(raised.value)


def test_numpy_bool_flags_are_accepted():
  assert isinstance(_build(summaries=np.bool_(False)), tf.Operation)


def test_bad_name_of_reportable_loss():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="got 'bad name'"):
      estimator_accum.reportable_loss(tf.constant(1.0), name="bad name")


def test_across_workers_of_reportable_loss_must_be_a_bool():
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match="across_workers.*got 'yes'"):
      estimator_accum.reportable_loss(tf.constant(1.0), across_workers="yes")


@pytest.mark.parametrize("reuse", [None, tf.compat.v1.AUTO_REUSE])
def test_building_twice_in_one_graph_names_the_variable(reuse):
  """Also under a scope with AUTO_REUSE, where the second build would
  otherwise add into the first one's accumulators."""
  graph = tf.Graph()
  with graph.as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    loss = tf.reduce_sum(w * 2.0)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with tf.compat.v1.variable_scope("", reuse=reuse):
      estimator_accum.build_accumulating_train_op(loss, optimizer, 2)
      with pytest.raises(ValueError, match="'w/accum' already exists"):
        estimator_accum.build_accumulating_train_op(loss, optimizer, 2)


@pytest.mark.keras2
def test_built_under_a_reusing_scope():
  """Under the caller's variable_scope(reuse=True), where a Keras optimizer
  trains (a v1 optimizer's slots fail there, as in plain TensorFlow), the
  window creates its state and trains as it does outside."""
  weights = []
  for reuse in (None, True):
    with tf.Graph().as_default():
      tf.compat.v1.train.get_or_create_global_step()
      with tf.compat.v1.variable_scope("net"):
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0])
      with tf.compat.v1.variable_scope("net", reuse=reuse):
        train_op = estimator_accum.build_accumulating_train_op(
            tf.reduce_sum(tf.square(w - 3.0)),
            tf.keras.optimizers.legacy.Adam(0.1), 2)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(4):
          session.run(train_op)
        weights.append(session.run(w))
  assert not np.allclose(weights[0], [1.0, -2.0])
  np.testing.assert_array_equal(weights[1], weights[0])


def test_two_train_ops_need_two_counters():
  """A second accumulating train op (another var_list and name) refuses the
  first one's global_step; with a counter of its own, each op applies its
  own windows: w1 every 2 runs, w2 every 3."""
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(1.0)
  with tf.Graph().as_default():
    w1 = tf.compat.v1.get_variable("w1", initializer=0.0)
    w2 = tf.compat.v1.get_variable("w2", initializer=0.0)
    first = estimator_accum.build_accumulating_train_op(
        w1 * 1.0, optimizer, 2, var_list=[w1], name="first")
    with pytest.raises(ValueError) as raised:
      estimator_accum.build_accumulating_train_op(
          w2 * 10.0, optimizer, 3, var_list=[w2], name="second")
    assert ("global_step global_step already counts the micro-batches of the "
            "accumulating train op 'first'; the train op 'second' would "
            "increment it too") in str(raised.value)
    counter = tf.compat.v1.get_variable(
        "second_micro_batches", [], tf.int64, trainable=False,
        initializer=tf.compat.v1.zeros_initializer())
    second = estimator_accum.build_accumulating_train_op(
        w2 * 10.0, optimizer, 3, var_list=[w2], name="second",
        global_step=counter)
    # The progress line counts the first op's micro-batches, once.
    assert list(estimator_accum.get_accumulation_state().examples) == [0]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run([first, second])
      assert session.run([w1, w2]) == [-3.0, -20.0]


def test_cross_replica_context_is_refused():
  graph = tf.Graph()
  with graph.as_default(), tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    with pytest.raises(RuntimeError, match="must be called in replica context"):
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w), tf.compat.v1.train.GradientDescentOptimizer(0.1), 2)


def test_proximal_adagrad_under_a_strategy_is_refused():
  """TensorFlow 2.15 cannot build its slots for mirrored variables (plain
  minimize fails deep inside colocate_with): one line instead."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

  def build():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    estimator_accum.build_accumulating_train_op(
        tf.reduce_sum(w), tf.compat.v1.train.ProximalAdagradOptimizer(0.1), 2)

  with tf.Graph().as_default(), strategy.scope():
    with pytest.raises(TypeError, match="optimizer ProximalAdagradOptimizer "
                       "cannot run under MirroredStrategy"):
      strategy.extended.call_for_each_replica(build)


@pytest.mark.parametrize("argument, value", [
    ("every_n_micro_batches", 0), ("micro_batch_size", 2.0)])
def test_bad_hook_arguments(argument, value):
  with pytest.raises(ValueError, match=f"{argument} must be an int >= 1, "
                     f"got {value!r}"):
    estimator_accum.AccumulationLoggingHook(**{argument: value})
