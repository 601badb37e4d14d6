"""The accumulator copy: where the window's sums live, memory against
communication, under MirroredStrategy on 2 logical CPUs.

  python benchmarks/sharded_accumulators.py [--model bert_small] [--k 4]

For `accumulator_placement` "device" (every replica keeps a whole copy)
and "sharded" (each keeps 1/N, all-reduced every micro-batch): the bytes of
accumulators per replica, what crosses replicas each micro-batch and at the
window's end, the peak tensor memory of the step (both replicas' tensors,
in one BFC allocator: TF_CPU_ALLOCATOR_USE_BFC=true, as a GPU holds
tensors), and the seconds per micro-batch, side by side, in a process each.
TensorFlow 2.15 has no reduce-scatter on CPU and no public all-to-all in
its strategies, so the micro-batch's reduction is an all-reduce of which
each replica keeps its slice; the window's end all-gathers the slices.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import bench  # noqa: E402

REPLICAS = 2


def measure(model, placement, k, micro_batch, windows=3):
  import tensorflow as tf  # noqa: PLC0415

  import estimator_accum  # noqa: PLC0415
  from benchmarks.accumulation_overhead import MODELS  # noqa: PLC0415

  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(REPLICAS)])
  with tf.Graph().as_default():
    with strategy.scope():
      def step():
        loss = MODELS[model](batch_size=micro_batch)
        return estimator_accum.build_accumulating_train_op(
            loss, tf.compat.v1.train.AdamOptimizer(1e-4), k,
            accumulator_placement=placement, summaries=False,
            log_every_n_micro_batches=None)
      tf.compat.v1.train.get_or_create_global_step()
      train_op = strategy.extended.call_for_each_replica(step)
      train_op = strategy.group(train_op)
    parameters = sum(v.shape.num_elements()
                     for v in tf.compat.v1.trainable_variables())
    accumulators = sum(
        v.shape.num_elements() * v.dtype.size
        for v in tf.compat.v1.global_variables()
        if "/accum" in v.name and not v.name.endswith("accum_rows:0"))
    # The dense sums split in slices (padded to replicas x slice).
    sliced = sum(v.shape.num_elements() * v.dtype.size * REPLICAS
                 for v in tf.compat.v1.global_variables()
                 if v.name.endswith("/accum_shard:0"))
    config = tf.compat.v1.ConfigProto(device_count={"CPU": REPLICAS})
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.config.experimental.reset_memory_stats("CPU:0")
      for _ in range(k):
        session.run(train_op)
      started = time.perf_counter()
      for _ in range(windows * k):
        session.run(train_op)
      seconds = (time.perf_counter() - started) / (windows * k)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return {"placement": placement, "parameters": parameters,
          "accumulator_bytes_per_replica": accumulators,
          "sliced_bytes": sliced,
          "peak_bytes": peak, "seconds_per_micro_batch": seconds}


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--model", default="bert_small")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=4)
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    from absl import logging  # noqa: PLC0415
    logging.set_verbosity(logging.ERROR)
    print(json.dumps(measure(args.model, args.child, args.k,
                             args.micro_batch)))
    return 0
  table = bench.Rows(
      f"{args.model}, MirroredStrategy x{REPLICAS} (logical CPUs), "
      f"micro-batch {args.micro_batch} per replica, k={args.k}, Adam. "
      "Peak: the BFC allocator on CPU (TF_CPU_ALLOCATOR_USE_BFC=true), "
      "both replicas' tensors, as a GPU holds tensors.", args.json,
      markdown=True, formats={"s per micro-batch": ".3f"})
  rows = {}
  for placement in ("device", "sharded"):
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--model", args.model,
         "--k", str(args.k), "--micro_batch", str(args.micro_batch),
         "--child", placement], capture_output=True, text=True, check=False)
    if result.returncode != 0:
      print(result.stderr[-3000:])
      table.fail(f"the {placement} child failed")
      return table.exit_code()
    row = rows[placement] = json.loads(result.stdout.strip().splitlines()[-1])
    model_bytes = row["parameters"] * 4
    sliced = row["sliced_bytes"]
    end = (f"all-reduce {model_bytes / 2**20:,.1f} MB" if not sliced else
           f"all-gather {sliced / REPLICAS / 2**20:,.1f} MB a replica, "
           f"all-reduce {(model_bytes - sliced) / 2**20:,.1f} MB")
    table.add(**{
        "placement": placement,
        "accumulators per replica":
            f"{row['accumulator_bytes_per_replica'] / 2**20:,.1f} MB",
        "all-reduced each micro-batch": f"{sliced / 2**20:,.1f} MB",
        "at the window's end": end,
        "peak (both replicas)": f"{row['peak_bytes'] / 2**20:,.0f} MB",
        "s per micro-batch": row["seconds_per_micro_batch"]})
  saved = rows["device"]["peak_bytes"] - rows["sharded"]["peak_bytes"]
  print(f"sharded: {saved / 2**20:,.0f} MB less peak, "
        f"{rows['sharded']['seconds_per_micro_batch'] / rows['device']['seconds_per_micro_batch']:.2f}x "
        "the time per micro-batch")
  return table.exit_code()


if __name__ == "__main__":
  sys.exit(main())
