"""The public Estimator on every release: one model_fn, written with
`estimator_accum.EstimatorSpec`, `ModeKeys` and `RunConfig` (tf.estimator's
on 2.15, the library's on 2.16+), trains to plain TensorFlow's big-batch
weights, evaluates, predicts, exports, resumes, warm-starts and runs
`train_and_evaluate`; bad arguments are named in one line."""

import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.estimator import run_config
from harness import support

K, MICRO_BATCH, UPDATES = 4, 8, 3


def model_fn(features, labels, mode, params, config):
  """Written once, for 2.15 and 2.21 alike."""
  assert config.model_dir
  if labels is None:  # Serving: no labels.
    labels = tf.zeros(tf.shape(features["x"])[:1], tf.int32)
  loss = support.model_loss(features, labels)
  if mode == estimator_accum.ModeKeys.PREDICT:
    batch_loss = tf.fill(tf.shape(labels), loss)
    return estimator_accum.EstimatorSpec(mode, predictions={
        "loss_of_the_batch": batch_loss, "labels": labels}, export_outputs={
            "serving_default": estimator_accum.PredictOutput(
                {"loss_at_label_0": batch_loss})})
  if mode == estimator_accum.ModeKeys.EVAL:
    return estimator_accum.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "mean_label": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32))})
  train_op = estimator_accum.build_accumulating_train_op(
      loss, params["optimizer"](), K, summaries=False,
      log_every_n_micro_batches=None)
  return estimator_accum.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _input_fn(data, batch):
  def input_fn():
    return tf.data.Dataset.from_tensor_slices(
        ({"x": data["x"], "ids": data["ids"]}, data["labels"])).batch(batch)
  return input_fn


def _estimator(model_dir, **config):
  return estimator_accum.Estimator(
      model_fn, config=estimator_accum.RunConfig(
          model_dir=str(model_dir), tf_random_seed=0,
          **{"save_checkpoints_steps": 4, **config}),
      params={"optimizer": support.V1_OPTIMIZERS["adam"]})


def _weights(estimator):
  return {name: estimator.get_variable_value(name)
          for name in support.weight_names()}


@pytest.fixture(scope="module")
def data():
  return support.make_data(K * MICRO_BATCH * UPDATES)


@pytest.fixture(scope="module")
def expected(data):
  return support.reference_train(support.V1_OPTIMIZERS["adam"], data,
                                 K * MICRO_BATCH, UPDATES)


def test_the_types_are_tf_estimators_where_it_exists():
  tf_estimator = estimator_accum.releases.estimator()
  for name in ("EstimatorSpec", "ModeKeys", "RunConfig"):
    ours = getattr(estimator_accum, name)
    if tf_estimator is not None:
      assert ours is getattr(tf_estimator, name)
    else:
      assert ours.__module__.startswith("estimator_accum.estimator")
  assert (estimator_accum.ModeKeys.TRAIN, estimator_accum.ModeKeys.EVAL,
          estimator_accum.ModeKeys.PREDICT) == ("train", "eval", "infer")


def test_training_equals_the_big_batch_and_the_rest_works(tmp_path, data,
                                                          expected):
  estimator = _estimator(tmp_path / "run")
  assert estimator.train(_input_fn(data, MICRO_BATCH),
                         max_steps=K * UPDATES) is estimator
  assert estimator.get_variable_value("global_step") == K * UPDATES
  support.assert_weights_moved(expected, "big batch")
  support.assert_weights_close(_weights(estimator), expected,
                               what=f"TensorFlow {tf.__version__}")
  assert "gradient_accumulation/updates_applied" in (
      estimator.get_variable_names())
  # 96 examples in batches of 10: the last holds 6; all are evaluated.
  metrics = estimator.evaluate(_input_fn(data, 10), name="held_out")
  assert metrics["global_step"] == K * UPDATES
  np.testing.assert_allclose(metrics["mean_label"], data["labels"].mean(),
                             rtol=1e-6)
  assert os.listdir(tmp_path / "run" / "eval_held_out")
  predictions = list(estimator.predict(_input_fn(data, 10)))
  assert len(predictions) == len(data["labels"])
  np.testing.assert_array_equal([p["labels"] for p in predictions],
                                data["labels"])
  batches = list(estimator.predict(_input_fn(data, 10),
                                   predict_keys=["labels"],
                                   yield_single_examples=False))
  assert [sorted(b) for b in batches] == [["labels"]] * 10
  with pytest.raises(ValueError, match=r"predict_keys: \['nope'\]"):
    next(estimator.predict(_input_fn(data, 10), predict_keys="nope"))


def test_steps_go_on_from_the_checkpoint_and_resume_exactly(tmp_path, data,
                                                            expected):
  estimator = _estimator(tmp_path / "run")
  # Stopped mid-window (micro-batch 6), then 6 more from the rest.
  estimator.train(_input_fn(data, MICRO_BATCH), steps=6)
  assert estimator.get_variable_value("global_step") == 6
  rest = {key: value[6 * MICRO_BATCH:] for key, value in data.items()}
  again = _estimator(tmp_path / "run")
  again.train(_input_fn(rest, MICRO_BATCH), steps=6)
  assert again.get_variable_value("global_step") == K * UPDATES
  support.assert_weights_close(_weights(again), expected, what="resumed")
  # Without steps or max_steps: until the input ends.
  until_end = _estimator(tmp_path / "end")
  until_end.train(_input_fn(data, MICRO_BATCH))
  support.assert_weights_close(_weights(until_end), expected,
                               what="to the input's end")


def test_under_mirrored_strategy_equals_the_big_batch(tmp_path):
  from harness.keras_exactness import mirrored_strategy  # noqa: PLC0415

  strategy = mirrored_strategy()
  replicas = strategy.num_replicas_in_sync
  data = support.make_data(replicas * K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(support.V1_OPTIMIZERS["adam"], data,
                                     replicas * K * MICRO_BATCH, UPDATES)
  estimator = _estimator(tmp_path / "run", train_distribute=strategy,
                         session_config=tf.compat.v1.ConfigProto(
                             device_count={"CPU": replicas}))
  estimator.train(_input_fn(data, MICRO_BATCH), max_steps=K * UPDATES)
  support.assert_weights_close(_weights(estimator), expected,
                               what=f"mirrored, TensorFlow {tf.__version__}")


class _Exporter:
  """An exporter as train_and_evaluate calls one (tf.estimator's
  interface): it exports a SavedModel and records its calls."""
  name = "latest"

  def __init__(self):
    self.calls = []

  def export(self, estimator, export_path, checkpoint_path, eval_result,
             is_the_final_export):
    self.calls.append((int(eval_result["global_step"]), is_the_final_export))
    return estimator.export_saved_model(export_path, _serving_input,
                                        checkpoint_path=checkpoint_path)


def _serving_input():
  features = {"x": tf.compat.v1.placeholder(tf.float32,
                                            [None, support.NUM_FEATURES]),
              "ids": tf.compat.v1.placeholder(
                  tf.int64, [None, support.IDS_PER_EXAMPLE])}
  return estimator_accum.ServingInputReceiver(features, features)


def test_train_and_evaluate_on_one_process(tmp_path, data, expected):
  estimator = _estimator(tmp_path / "run")
  exporter = _Exporter()
  metrics, exports = estimator_accum.train_and_evaluate(
      estimator,
      estimator_accum.TrainSpec(_input_fn(data, MICRO_BATCH),
                                max_steps=K * UPDATES),
      estimator_accum.EvalSpec(_input_fn(data, 10), steps=None,
                               exporters=exporter, throttle_secs=0))
  support.assert_weights_close(_weights(estimator), expected,
                               what="train_and_evaluate")
  assert metrics["global_step"] == K * UPDATES
  # Saves at 4, 8, 12 (the first, at 0, is not evaluated); the last final.
  assert exporter.calls == [(4, False), (8, False), (12, True)]
  assert len(exports) == 1 and os.path.isdir(exports[0])
  # The SavedModel serves the export output at the final weights.
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta = tf.compat.v1.saved_model.load(session, ["serve"], exports[0])
    signature = meta.signature_def["serving_default"]
    fetched = session.run(
        signature.outputs["loss_at_label_0"].name,
        {signature.inputs["x"].name: data["x"][:5],
         signature.inputs["ids"].name: data["ids"][:5]})
  in_training = estimator.predict(_input_fn(
      {**data, "labels": np.zeros_like(data["labels"])}, 5),
      yield_single_examples=False)
  np.testing.assert_allclose(fetched, next(in_training)["loss_of_the_batch"],
                             rtol=1e-6)


def test_warm_start_from_a_checkpoint(tmp_path, data):
  first = _estimator(tmp_path / "first")
  first.train(_input_fn(data, MICRO_BATCH), max_steps=K)
  started = estimator_accum.Estimator(
      model_fn, model_dir=str(tmp_path / "warm"), params={
          "optimizer": lambda: tf.compat.v1.train.GradientDescentOptimizer(
              0.0)}, warm_start_from=first.latest_checkpoint())
  started.train(_input_fn(data, MICRO_BATCH), max_steps=K)
  support.assert_weights_close(_weights(started), _weights(first),
                               what="warm-started at a learning rate of 0")


def test_bad_arguments_are_named(tmp_path):
  with pytest.raises(TypeError, match="model_fn is a function"):
    estimator_accum.Estimator("model_fn", model_dir=str(tmp_path))
  estimator = _estimator(tmp_path / "run")
  with pytest.raises(ValueError, match=r"steps=3 and max_steps=4"):
    estimator.train(lambda: None, steps=3, max_steps=4)
  with pytest.raises(ValueError, match=r"max_steps must be in 1\.\.\S+, "
                     r"got 0"):
    estimator.train(lambda: None, max_steps=0)
  with pytest.raises(ValueError, match="model_dir='a' and config.model_dir"):
    estimator_accum.Estimator(model_fn, model_dir="a", config=(
        estimator_accum.RunConfig(model_dir="b")))
  with pytest.raises(TypeError, match="TrainSpec: input_fn is a function"):
    estimator_accum.TrainSpec("data")
  with pytest.raises(ValueError, match="throttle_secs is seconds"):
    estimator_accum.EvalSpec(lambda: None, throttle_secs=-1)
  with pytest.raises(ValueError, match="no checkpoint"):
    estimator.get_variable_value("global_step")


def test_the_librarys_run_config_reads_tf_config(monkeypatch):
  """The library's RunConfig (2.16+'s) reads TF_CONFIG as tf.estimator's
  does, and refuses what it does not run."""
  RunConfig = run_config.RunConfig  # noqa: N806
  plain = RunConfig()
  assert (plain.task_type, plain.task_id, plain.is_chief,
          plain.num_worker_replicas, plain.save_checkpoints_secs) == (
              "worker", 0, True, 1, 600)
  monkeypatch.setenv("TF_CONFIG", (
      '{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", '
      '"127.0.0.1:3"], "ps": ["127.0.0.1:4"], "evaluator": ["127.0.0.1:5"]}, '
      '"task": {"type": "worker", "index": 1}}'))
  config = RunConfig(save_checkpoints_steps=10)
  assert (config.task_type, config.task_id, config.is_chief,
          config.num_worker_replicas, config.num_ps_replicas,
          config.global_id_in_cluster, config.master) == (
              "worker", 1, False, 3, 1, 2, "grpc://127.0.0.1:3")
  assert "evaluator" not in config.cluster_spec.as_dict()
  assert config.save_checkpoints_secs is None
  assert config.replace(save_checkpoints_secs=5).save_checkpoints_steps is None
  with pytest.raises(ValueError, match="save_checkpoints_steps=1 and "
                     "save_checkpoints_secs=2 both given"):
    RunConfig(save_checkpoints_steps=1, save_checkpoints_secs=2)
  with pytest.raises(ValueError, match="eval_distribute=.* is not run"):
    RunConfig(eval_distribute="mirrored")
  with pytest.raises(ValueError, match="save_summary_steps must be in"):
    RunConfig(save_summary_steps=0)


def test_a_cluster_without_a_strategy_or_ps_trains_nothing_but_exports(
    monkeypatch, tmp_path, data):
  """Several training tasks with neither a strategy nor ps tasks cannot
  train as one: `train` says so in one line. The same Estimator still
  evaluates and exports in such a task (a chief exporting after the
  job, as the examples' do)."""
  _estimator(tmp_path).train(_input_fn(data, MICRO_BATCH), max_steps=K)
  monkeypatch.setenv("TF_CONFIG", (
      '{"cluster": {"chief": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]}, '
      '"task": {"type": "chief", "index": 0}}'))
  estimator = estimator_accum.Estimator(
      model_fn, config=estimator_accum.RunConfig(model_dir=str(tmp_path)),
      params={"optimizer": support.V1_OPTIMIZERS["adam"]})
  with pytest.raises(ValueError, match="Estimator.train: TF_CONFIG names 2 "
                     "training tasks and no ps"):
    estimator.train(_input_fn(data, MICRO_BATCH), max_steps=2 * K)
  assert estimator.evaluate(_input_fn(data, MICRO_BATCH))["global_step"] == K
  path = estimator.export_saved_model(str(tmp_path / "export"),
                                      _serving_input)
  assert tf.io.gfile.exists(os.path.join(
      path.decode() if isinstance(path, bytes) else path, "saved_model.pb"))
