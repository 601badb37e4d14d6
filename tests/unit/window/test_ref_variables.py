"""Models built with reference (non-resource) variables.

TF1 scripts that call tf.compat.v1.disable_v2_behavior() build them, with
control flow v1: they train exactly as big batches do. Control flow v2
cannot update them inside a tf.cond: that combination is refused at build
time with the two ways out, not left to fail inside the optimizer. A
batch_norm layer's moving statistics follow the windows there too.
"""

import pytest
import tensorflow as tf

import estimator_accum
from harness import support

v1 = tf.compat.v1.train
K = 4
MICRO_BATCH = 4
UPDATES = 3
_VARIABLE_TYPES = []


def _ref_variable_model_fn(features, labels, mode, params):
  scope = tf.compat.v1.get_variable_scope()
  with tf.compat.v1.variable_scope(scope, use_resource=False):
    spec = support.accumulating_model_fn(features, labels, mode, params)
  _VARIABLE_TYPES.extend(
      type(v).__name__ for v in tf.compat.v1.global_variables()
      if v.trainable or v.op.name.startswith("bn/moving_"))
  return spec


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_fn", [
    lambda: v1.AdamOptimizer(0.05),
    lambda: v1.MomentumOptimizer(0.2, 0.9, use_nesterov=True),
    lambda: v1.RMSPropOptimizer(0.05),
], ids=["adam", "nesterov", "rmsprop"])
def test_ref_variables_equal_big_batch(optimizer_fn, tmp_path):
  tf.compat.v1.disable_control_flow_v2()  # As disable_v2_behavior() does.
  try:
    _train_and_compare(optimizer_fn, tmp_path)
  finally:
    tf.compat.v1.enable_control_flow_v2()


def test_ref_variables_under_control_flow_v2_are_refused():
  with tf.Graph().as_default():
    with tf.compat.v1.variable_scope("model", use_resource=False):
      w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
      b = tf.compat.v1.get_variable("b", initializer=tf.ones([3]),
                                    use_resource=True)
    with pytest.raises(ValueError) as raised:
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w * b), v1.AdamOptimizer(0.1), K)
  message = str(raised.value)
  assert "var_list holds reference variables (model/w:0)" in message
  assert "use_resource=True" in message
  assert "tf.compat.v1.disable_control_flow_v2()" in message


@pytest.mark.keras2
def test_ref_variables_with_a_keras_optimizer_are_refused():
  """Keras cannot make slots for reference variables (plain apply_gradients
  fails inside TensorFlow): one line naming the variable and the ways out,
  under control flow v1 (disable_v2_behavior's) too."""
  tf.compat.v1.disable_control_flow_v2()
  try:
    with tf.Graph().as_default():
      with tf.compat.v1.variable_scope("model", use_resource=False):
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
      with pytest.raises(ValueError) as raised:
        estimator_accum.build_accumulating_train_op(
            tf.reduce_sum(w), tf.keras.optimizers.legacy.Adam(0.1), K)
  finally:
    tf.compat.v1.enable_control_flow_v2()
  message = str(raised.value)
  assert "var_list holds reference variables (model/w:0)" in message
  assert "Keras optimizer Adam cannot create its slots" in message
  assert "use_resource=True" in message


def _train_and_compare(optimizer_fn, tmp_path):
  _VARIABLE_TYPES.clear()
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                     UPDATES)
  config = tf.estimator.RunConfig(
      model_dir=str(tmp_path), tf_random_seed=0,
      session_config=estimator_accum.own_threads(tf.compat.v1.ConfigProto(
          intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)))
  estimator = tf.estimator.Estimator(
      _ref_variable_model_fn, config=config,
      params=dict(optimizer_fn=optimizer_fn, k=K, batch_norm_momentum=0.5))
  estimator.train(support.micro_batch_input_fn(data, MICRO_BATCH),
                  max_steps=K * UPDATES)
  assert _VARIABLE_TYPES and set(_VARIABLE_TYPES) == {"RefVariable"}, (
      _VARIABLE_TYPES)
  actual = {name: estimator.get_variable_value(name)
            for name in support.weight_names()}
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * UPDATES, UPDATES, "ref variables")
  # A batch_norm layer's moving statistics are reference variables too.
  moving = support.reference_batch_norm(data["x"], [K * MICRO_BATCH] * UPDATES,
                                        0.5)
  for name, want in zip(["bn/moving_mean", "bn/moving_variance"], moving):
    support.assert_weights_close({name: estimator.get_variable_value(name)},
                                 {name: want}, what="ref variables")
