"""Optimizers and schedules that read global_step, which counts micro-batches.

AdagradDA's update reads a step count: given the global step it would see k
times big-batch training's count, so it is refused with the fix named (its
exactness with update_count is in test_exact_optimizers). A learning rate
computed from the global step gets a warning; one computed from
update_count, or constant, does not. SyncReplicasOptimizer, which counts
steps and gathers workers itself, is refused. An optimizer whose
compute_gradients the window bypasses gets a warning.
"""

import logging

import pytest
import tensorflow as tf

import estimator_accum

v1 = tf.compat.v1.train
K = 4
_WARNING = "is computed from global_step, which counts micro-batches"


def _build(make_optimizer, k=K):
  """Builds the train op in a fresh graph; `make_optimizer(global_step)`."""
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    global_step = v1.get_or_create_global_step()
    return estimator_accum.build_accumulating_train_op(
        tf.reduce_sum(w * w), make_optimizer(global_step), k)


def _warnings(caplog, make_optimizer, k=K):
  with caplog.at_level(logging.WARNING, logger="absl"):
    _build(make_optimizer, k)
  return [r.getMessage() for r in caplog.records if _WARNING in r.getMessage()]


def test_adagrad_da_given_global_step_is_refused():
  with pytest.raises(ValueError) as raised:
    _build(lambda step: v1.AdagradDAOptimizer(0.1, step))
  message = str(raised.value)
  assert "AdagradDAOptimizer was given global_step 'global_step:0'" in message
  assert "4 times the step count" in message
  assert "global_step=estimator_accum.update_count(4)" in message


def test_adagrad_da_given_a_tensor_of_global_step_is_refused():
  with pytest.raises(ValueError, match="AdagradDAOptimizer was given"):
    _build(lambda step: v1.AdagradDAOptimizer(0.1, tf.identity(step) + 0))


def test_adagrad_da_counting_updates_or_k_1_is_accepted():
  _build(lambda step: v1.AdagradDAOptimizer(
      0.1, estimator_accum.update_count(K)))
  _build(lambda step: v1.AdagradDAOptimizer(0.1, step), k=1)


@pytest.mark.keras2
@pytest.mark.parametrize("make_optimizer", [
    lambda step: v1.GradientDescentOptimizer(
        v1.exponential_decay(0.1, step, 100, 0.5)),
    lambda step: v1.MomentumOptimizer(
        v1.polynomial_decay(0.1, step, 1000), 0.9),
    lambda step: v1.AdamOptimizer(
        tf.compat.v1.train.piecewise_constant(step, [100], [0.1, 0.01])),
    lambda step: tf.keras.optimizers.legacy.SGD(
        0.1 * 0.5 ** tf.cast(step, tf.float32)),
], ids=["exponential_decay", "polynomial_decay", "piecewise_adam",
        "keras_legacy"])
def test_schedule_on_global_step_warns(caplog, make_optimizer):
  messages = _warnings(caplog, make_optimizer)
  assert len(messages) == 1, messages
  assert "learning_rate" in messages[0]
  assert "estimator_accum.update_count(4)" in messages[0]


@pytest.mark.parametrize("make_optimizer", [
    lambda step: v1.GradientDescentOptimizer(
        v1.exponential_decay(0.1, estimator_accum.update_count(K), 100, 0.5)),
    lambda step: v1.AdamOptimizer(
        0.1 * tf.cast(estimator_accum.update_count(K) + 1, tf.float32)),
    lambda step: v1.AdamOptimizer(0.1),
    lambda step: v1.AdamOptimizer(tf.constant(0.1)),
], ids=["decay_on_update_count", "arithmetic_on_update_count", "float",
        "constant"])
def test_schedule_on_update_count_does_not_warn(caplog, make_optimizer):
  assert _warnings(caplog, make_optimizer) == []


def test_schedule_on_global_step_with_k_1_does_not_warn(caplog):
  assert _warnings(caplog, lambda step: v1.GradientDescentOptimizer(
      v1.exponential_decay(0.1, step, 100, 0.5)), k=1) == []


def test_sync_replicas_optimizer_is_refused():
  with pytest.raises(TypeError) as raised:
    _build(lambda step: v1.SyncReplicasOptimizer(v1.AdamOptimizer(0.1), 2))
  message = str(raised.value)
  assert "optimizer SyncReplicasOptimizer cannot be accumulated" in message
  assert "MultiWorkerMirroredStrategy" in message


@pytest.mark.estimator
def test_schedule_on_global_step_warns_once_under_mirrored_strategy(
    caplog, tmp_path):
  """Every replica builds the train op; the warning is given once, and the
  replicas' global step (a MirroredVariable) is recognized."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

  def model_fn(features, labels, mode):
    del labels
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    loss = tf.reduce_sum(w * features)
    step = v1.get_global_step()
    train_op = estimator_accum.build_accumulating_train_op(
        loss, v1.GradientDescentOptimizer(
            v1.exponential_decay(0.1, step, 100, 0.5)), K)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  config = tf.estimator.RunConfig(
      model_dir=str(tmp_path), train_distribute=strategy,
      session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}))
  estimator = tf.estimator.Estimator(model_fn, config=config)
  with caplog.at_level(logging.WARNING, logger="absl"):
    estimator.train(
        lambda: tf.data.Dataset.from_tensors(
            (tf.ones([3]), 0.0)).repeat(), max_steps=K)
  messages = [r.getMessage() for r in caplog.records
              if _WARNING in r.getMessage()]
  assert len(messages) == 1, messages


class _NoisyGradients(v1.GradientDescentOptimizer):
  """An optimizer that changes its gradients in compute_gradients."""

  def compute_gradients(self, loss, var_list=None, **kwargs):
    pairs = super().compute_gradients(loss, var_list, **kwargs)
    return [(g + 0.01, v) for g, v in pairs]


def test_overridden_compute_gradients_warns(caplog):
  with caplog.at_level(logging.WARNING, logger="absl"):
    _build(lambda step: _NoisyGradients(0.1))
    _build(lambda step: v1.AdamOptimizer(0.1))
  messages = [r.getMessage() for r in caplog.records
              if "overrides compute_gradients" in r.getMessage()]
  assert len(messages) == 1, messages
  assert "optimizer _NoisyGradients overrides compute_gradients" in messages[0]
