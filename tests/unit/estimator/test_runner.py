"""A model_fn through the library's sessions (no Estimator): trained with
k micro-batches it ends at plain TensorFlow's big-batch weights, stopped
and run on it ends there too, its evaluation is the metrics' values over
the whole input, its predictions one per example. On every release."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.estimator import runner as session_runner
from harness import support

K, MICRO_BATCH, UPDATES = 4, 8, 3


def _model_fn(features, labels, mode, params):
  loss = support.model_loss(features, labels)
  if mode == session_runner.PREDICT:
    return session_runner.model_spec(mode, predictions={
        "loss_of_the_batch": tf.fill(tf.shape(labels), loss),
        "labels": labels})
  if mode == session_runner.EVAL:
    return session_runner.model_spec(mode, loss=loss, eval_metric_ops={
        "mean_label": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32))})
  train_op = estimator_accum.build_accumulating_train_op(
      loss, params["optimizer"](), K, summaries=False,
      log_every_n_micro_batches=None)
  return session_runner.model_spec(mode, loss=loss, train_op=train_op)


def _input_fn(data, batch):
  def input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"x": data["x"], "ids": data["ids"]}, data["labels"]))
    return dataset.batch(batch)
  return input_fn


def _runner(tmp_path):
  return session_runner.SessionEstimator(
      _model_fn, session_runner.RunSettings(
          model_dir=str(tmp_path / "run"), tf_random_seed=0,
          save_checkpoints_steps=4),
      params={"optimizer": support.V1_OPTIMIZERS["adam"]})


def _weights(runner):
  return {name: runner.get_variable_value(name)
          for name in support.weight_names()}


@pytest.fixture(scope="module")
def data():
  return support.make_data(K * MICRO_BATCH * UPDATES)


def test_training_equals_the_big_batch(tmp_path, data):
  expected = support.reference_train(support.V1_OPTIMIZERS["adam"], data,
                                     K * MICRO_BATCH, UPDATES)
  runner = _runner(tmp_path).train(_input_fn(data, MICRO_BATCH),
                                   max_steps=K * UPDATES)
  assert runner.get_variable_value("global_step") == K * UPDATES
  support.assert_weights_moved(expected, "big batch")
  support.assert_weights_close(_weights(runner), expected,
                               what=f"TensorFlow {tf.__version__}")


def test_a_run_stopped_and_run_on_ends_where_one_run_does(tmp_path, data):
  whole = _runner(tmp_path / "whole").train(_input_fn(data, MICRO_BATCH),
                                            max_steps=K * UPDATES)
  # Stopped at micro-batch 6, mid-window: the window is in the checkpoint.
  resumed = _runner(tmp_path / "resumed")
  resumed.train(_input_fn(data, MICRO_BATCH), max_steps=6)
  assert resumed.get_variable_value("global_step") == 6
  rest = {key: value[6 * MICRO_BATCH:] for key, value in data.items()}
  resumed.train(_input_fn(rest, MICRO_BATCH), max_steps=K * UPDATES)
  support.assert_weights_close(_weights(resumed), _weights(whole),
                               what="resumed")
  # Nothing more to do at max_steps: nothing is trained.
  before = _weights(resumed)
  resumed.train(_input_fn(data, MICRO_BATCH), max_steps=K * UPDATES)
  support.assert_weights_close(_weights(resumed), before, what="again")


def test_evaluation_and_prediction_cover_the_whole_input(tmp_path, data):
  runner = _runner(tmp_path).train(_input_fn(data, MICRO_BATCH),
                                   max_steps=K)
  # 96 examples in batches of 10: the last batch holds 6.
  metrics = runner.evaluate(_input_fn(data, 10))
  assert metrics["global_step"] == K
  np.testing.assert_allclose(metrics["mean_label"], data["labels"].mean(),
                             rtol=1e-6)
  assert np.isfinite(metrics["loss"]) and metrics["loss"] > 0
  assert runner.evaluate(_input_fn(data, 10), steps=2)["mean_label"] == (
      pytest.approx(data["labels"][:20].mean()))
  predictions = list(runner.predict(_input_fn(data, 10)))
  assert len(predictions) == len(data["labels"])
  np.testing.assert_array_equal([p["labels"] for p in predictions],
                                data["labels"])


def test_the_spec_is_estimators_where_it_exists():
  spec = session_runner.model_spec(session_runner.PREDICT,
                                   predictions={"y": tf.constant([1.0])})
  estimator = estimator_accum.releases.estimator()
  expected = (estimator.EstimatorSpec if estimator is not None
              else session_runner.ModelSpec)
  assert isinstance(spec, expected)
  assert spec.mode == "infer"


def test_training_in_each_replica_equals_the_big_batch(tmp_path):
  """`train_distribute` (MirroredStrategy over 2 CPUs): each replica takes
  the next micro-batch of the input, as Estimator's does; the window of
  2 replicas x K micro-batches ends at the big batch of 2 x K x B."""
  from harness.keras_exactness import mirrored_strategy  # noqa: PLC0415

  strategy = mirrored_strategy()
  replicas = strategy.num_replicas_in_sync
  assert replicas == 2
  data = support.make_data(replicas * K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(support.V1_OPTIMIZERS["adam"], data,
                                     replicas * K * MICRO_BATCH, UPDATES)
  runner = session_runner.SessionEstimator(
      _model_fn, session_runner.RunSettings(
          model_dir=str(tmp_path / "run"), tf_random_seed=0,
          save_checkpoints_steps=4, train_distribute=strategy,
          session_config=tf.compat.v1.ConfigProto(
              device_count={"CPU": replicas})),
      params={"optimizer": support.V1_OPTIMIZERS["adam"]})
  runner.train(_input_fn(data, MICRO_BATCH), max_steps=K * UPDATES)
  assert runner.get_variable_value("global_step") == K * UPDATES
  support.assert_weights_close(_weights(runner), expected,
                               what=f"mirrored, TensorFlow {tf.__version__}")
