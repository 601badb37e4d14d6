"""A planned Estimator job on tests/helpers/planner_support.py's model (for tests).

  python tests/jobs/planned_job.py --model_dir D --micro_batch auto \\
      --memory_budget_mb M [--ballast_from N --ballast_mb B]

Alone, it trains with `estimator_accum.train_halving_on_oom`: running out of
memory halves the micro-batch and goes on from the last checkpoint (one per
window). Under TF_CONFIG (`python -m tfconfig launch --workers 2 -- ...`) it
trains with MultiWorkerMirroredStrategy, each worker reading every other
example; the chief measures the plan and the other worker takes it from the
model directory. The chief writes the final weights and the plan it ran to
D/final_weights.npz.
"""

import argparse
import json
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from models import batch_plan  # noqa: E402
from tests.helpers import planner_support  # noqa: E402


def _arguments():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--effective_batch", type=int, default=32)
  parser.add_argument("--updates", type=int, default=4)
  parser.add_argument("--micro_batch", default="auto")
  parser.add_argument("--memory_budget_mb", type=float, default=None)
  parser.add_argument("--ballast_from", type=int, default=None,
                      help="the first example that carries ballast")
  parser.add_argument("--ballast_mb", type=float, default=0)
  return parser.parse_args()


def main():
  args = _arguments()
  cluster = json.loads(os.environ.get("TF_CONFIG", "{}"))
  workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
  is_chief = cluster.get("task", {}).get("index", 0) == 0
  strategy = (tf.distribute.MultiWorkerMirroredStrategy() if cluster
              else None)
  data = planner_support.make_data(
      args.effective_batch * args.updates, args.ballast_from,
      int(args.ballast_mb * 2**20 / 4))
  values = types.SimpleNamespace(
      micro_batch_size=args.micro_batch,
      memory_budget_mb=args.memory_budget_mb,
      memory_margin=estimator_accum.planner.DEFAULT_MARGIN)
  tf.io.gfile.makedirs(args.model_dir)
  plan = batch_plan.resolve(
      values, build=estimator_accum.estimator_step(
          planner_support.model_fn, planner_support.input_fn_for(
              planner_support.make_data(args.effective_batch))),
      effective_batch=args.effective_batch, replicas=workers,
      run_dir=args.model_dir, is_chief=is_chief)

  def train(plan):
    config = tf.estimator.RunConfig(
        model_dir=args.model_dir, train_distribute=strategy, tf_random_seed=0,
        save_checkpoints_steps=plan.k, log_step_count_steps=10**6)
    estimator = tf.estimator.Estimator(
        planner_support.model_fn, config=config,
        params=dict(k=plan.k, batch_size=plan.micro_batch))

    def input_fn(params, input_context=None):
      latest = tf.train.latest_checkpoint(args.model_dir)
      done = int(latest.rsplit("-", 1)[1]) if latest else 0
      dataset = planner_support.examples(data)
      if input_context is not None:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
      # No batch prefetched ahead (tf.data injects one by default): a
      # second batch held while the step runs, or not, as threads run,
      # would make the memory a micro-batch needs depend on timing.
      options = tf.data.Options()
      options.experimental_optimization.inject_prefetch = False
      return dataset.batch(params["batch_size"]).skip(done).with_options(
          options)

    max_steps = args.updates * plan.k
    if strategy is None:
      estimator.train(input_fn, max_steps=max_steps)
    else:
      tf.estimator.train_and_evaluate(
          estimator, tf.estimator.TrainSpec(input_fn, max_steps=max_steps),
          tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                                throttle_secs=0))
    return estimator

  if strategy is None:
    plan = estimator_accum.train_halving_on_oom(train, plan, args.model_dir)
  else:
    train(plan)
  if is_chief:
    reader = tf.train.load_checkpoint(args.model_dir)
    weights = {name: reader.get_tensor(name)
               for name in planner_support.WEIGHT_NAMES}
    np.savez(os.path.join(args.model_dir, "final_weights.npz"),
             global_step=reader.get_tensor("global_step"),
             micro_batch=plan.micro_batch, k=plan.k,
             **{name.replace("/", "__"): value
                for name, value in weights.items()})
    print(f"trained {plan.summary()}", flush=True)


if __name__ == "__main__":
  main()
