"""One worker of the recipe-vs-library comparison (run by
benchmarks/recipe_comparison.py through `python -m tfconfig launch`)."""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import recipe_model  # noqa: E402
from harness.collectives import CollectiveCounter  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--variant", choices=["recipe", "library"])
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=16)
  parser.add_argument("--updates", type=int, default=6)
  args = parser.parse_args()
  tf.compat.v1.disable_control_flow_v2()  # The recipe needs it.
  task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
  data = recipe_model.make_data(workers * args.k * args.micro_batch *
                                args.updates)
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  counter = CollectiveCounter(os.path.join(args.model_dir,
                                           f"collectives_{task}.json"))

  def input_fn(input_context=None):
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"x": data["x"], "ids": data["ids"]}, data["labels"]))
    if input_context is not None:
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    return dataset.batch(args.micro_batch).repeat()

  estimator = tf.estimator.Estimator(
      recipe_model.model_fn, config=tf.estimator.RunConfig(
          model_dir=args.model_dir, train_distribute=strategy,
          tf_random_seed=0, save_checkpoints_steps=100_000,
          log_step_count_steps=100_000),
      params=dict(variant=args.variant, k=args.k, hooks=[counter]))
  tf.estimator.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(input_fn,
                                        max_steps=args.k * args.updates),
      tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                            throttle_secs=0))
  if task == 0:
    np.savez(os.path.join(args.model_dir, "weights.npz"), **{
        name.replace("/", "__"): estimator.get_variable_value(name)
        for name in recipe_model.WEIGHTS})


if __name__ == "__main__":
  main()
