"""A task of a TF_CONFIG job written once against the public API
(`estimator_accum.Estimator`, `RunConfig`, `EstimatorSpec`, `ModeKeys`,
`train_and_evaluate`), as a user writes it for TensorFlow 2.15 and 2.21
alike. Started by `python -m tfconfig launch`:

  python -m tfconfig launch --workers 2 [--evaluator --evaluator_wait 60] -- \
      python tests/jobs/estimator_job.py multi_worker DIR
  python -m tfconfig launch --chief --workers 0 --ps 1 --evaluator --evaluator_wait 60 -- \
      python tests/jobs/estimator_job.py parameter_server DIR

Each trainer's micro-batch m of window u holds examples
(u * trainers + t) * K * B + m * B onwards (t: its place among the
trainers), so that the trainers' windows together are plain training's
batches of K * B * trainers. Every task that evaluates prints its metrics
as a line `metrics {...}`.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import support  # noqa: E402

K, B, UPDATES = 2, 4, 3


def model_fn(features, labels, mode, params):
  loss = support.model_loss(features, labels)
  if mode == estimator_accum.ModeKeys.EVAL:
    return estimator_accum.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "mean_label": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32))})
  train_op = estimator_accum.build_accumulating_train_op(
      loss, tf.compat.v1.train.AdamOptimizer(0.05), K, summaries=False,
      log_every_n_micro_batches=None)
  return estimator_accum.EstimatorSpec(mode, loss=loss, train_op=train_op)


def trainer_input_fn(data, trainers, position):
  """This trainer's micro-batches, in its windows' order."""
  rows = np.concatenate([
      np.arange((u * trainers + position) * K * B,
                (u * trainers + position + 1) * K * B)
      for u in range(UPDATES)])

  def input_fn():
    return tf.data.Dataset.from_tensor_slices(
        ({"x": data["x"][rows], "ids": data["ids"][rows]},
         data["labels"][rows])).batch(B)
  return input_fn


def main(kind, model_dir):
  tf_config = json.loads(os.environ["TF_CONFIG"])
  cluster, task = tf_config["cluster"], tf_config["task"]
  trainers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
  position = task["index"] + (len(cluster.get("chief", []))
                              if task["type"] == "worker" else 0)
  strategy = None
  # The evaluator evaluates on one device, outside the training cluster.
  if kind == "multi_worker" and task["type"] != "evaluator":
    strategy = (
        tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy())
  config = estimator_accum.RunConfig(
      model_dir=model_dir, tf_random_seed=0, train_distribute=strategy,
      save_checkpoints_steps=K)
  estimator = estimator_accum.Estimator(model_fn, config=config)
  data = support.make_data(K * B * trainers * UPDATES)
  metrics, _ = estimator_accum.train_and_evaluate(
      estimator,
      estimator_accum.TrainSpec(trainer_input_fn(data, trainers, position),
                                max_steps=K * UPDATES),
      estimator_accum.EvalSpec(trainer_input_fn(data, 1, 0), steps=None,
                               start_delay_secs=0, throttle_secs=0))
  if metrics is not None:
    print("metrics " + json.dumps({name: float(value) for name, value
                                   in metrics.items()}), flush=True)
  print(f"{task['type']}:{task['index']} done", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
