"""Window time and its communication across hosts: one worker per network
namespace of the test bed (tfconfig/testbed.py), links shaped with `tc`.

Every figure comes from a real Estimator job under
MultiWorkerMirroredStrategy (`python -m tfconfig launch --netns`), on BERT
shapes classifying random tokens (128 tokens, micro-batch 8), Adam, timed
per session.run by a hook; medians over the windows after a warm-up
window. Modes, side by side on the same link in one run:

  window        build_accumulating_train_op as it was before the window
                sent less: every table all-reduced whole
                (table_all_reduce="dense"), after the whole last
                micro-batch (overlap_backward=False)
  rows          tables by their touched rows ("auto"), after the whole
                last micro-batch
  overlap       tables by their rows, each pack sent as soon as its
                gradients are accumulated, during the last backward pass:
                the defaults
  overlap+bf16  the same with communication_dtype="bfloat16"
  recipe        the public Estimator recipe (benchmarks/public_recipe.py),
                control flow v1: it all-reduces every micro-batch
  plain         plain TensorFlow at the micro-batch: optimizer.minimize,
                an all-reduce and an update every micro-batch

  python benchmarks/window_across_hosts.py [--model minilm] [--workers 2]
      [--rates none,10gbit,1gbit] [--k 4] [--windows 4]
      [--heartbeat_seconds 60]   # slow links: estimator_accum.distribution.health.coordination_heartbeat

Printed per link and mode: the window's time (k micro-batches), micro-batches
per second per worker, and the share of the window its last step spends
beyond a micro-batch of the others (the all-reduce and the apply). Needs
root, iproute2 (`ip`, `tc`), as the test bed does.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.accumulation_overhead import MODELS  # noqa: E402
from benchmarks.public_recipe import recipe_train_op  # noqa: E402
from estimator_accum.distribution import health  # noqa: E402
from harness import bench  # noqa: E402
from tfconfig import testbed  # noqa: E402

MODES = ("window", "rows", "overlap", "overlap+bf16", "recipe", "plain")
# The window's options in each of its modes.
WINDOW_MODES = {
    "window": dict(table_all_reduce="dense", overlap_backward=False),
    "rows": dict(overlap_backward=False),
    "overlap": {},
    "overlap+bf16": dict(communication_dtype="bfloat16"),
}


def model_fn(features, labels, mode, params):
  del features, labels, mode
  loss = MODELS[params["model"]](batch_size=params["micro_batch"])
  optimizer = tf.compat.v1.train.AdamOptimizer(1e-5)
  reported = estimator_accum.reportable_loss(loss)
  name = params["mode"]
  if name in WINDOW_MODES:
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimizer, params["k"], summaries=False,
        log_every_n_micro_batches=None, **WINDOW_MODES[name])
  elif name == "recipe":
    train_op = recipe_train_op(loss, optimizer, params["k"])
  else:
    train_op = optimizer.minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(
      tf.estimator.ModeKeys.TRAIN, loss=reported, train_op=train_op,
      training_hooks=[bench.StepTimer(params["output"].format(
          index=params["index"]))])


def train_on_workers(model_fn, model_dir, params, max_steps):
  """Trains `model_fn` for `max_steps` micro-batches on this task of a
  MultiWorkerMirroredStrategy cluster (TF_CONFIG), on a constant input (the
  model makes its own batches); `params` get this worker's index."""
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  config = tf.estimator.RunConfig(
      model_dir=model_dir, train_distribute=strategy, tf_random_seed=0,
      save_checkpoints_steps=1_000_000, save_summary_steps=1_000_000,
      log_step_count_steps=1_000_000)
  index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  estimator = tf.estimator.Estimator(model_fn, config=config,
                                     params=dict(params, index=index))

  def input_fn(input_context=None):
    del input_context
    return tf.data.Dataset.from_tensors(({"x": 0.0}, 0)).repeat()

  # Estimator trains a multi-worker strategy only through train_and_evaluate.
  tf.estimator.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(input_fn, max_steps=max_steps),
      tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                            throttle_secs=0))


def run_task(args):
  """One worker of one mode (run by the launcher in its namespace)."""
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  warnings.simplefilter("ignore", UserWarning)
  if args.task == "recipe":
    # Its optimizer's merge_call inside a tf.cond needs control flow v1.
    tf.compat.v1.disable_control_flow_v2()
  if args.heartbeat_seconds:
    # Slow links: the coordination service's heartbeat (10 s by default)
    # can wait behind the window's all-reduce.
    health.coordination_heartbeat(args.heartbeat_seconds)
  train_on_workers(model_fn, args.model_dir, dict(
      mode=args.task, k=args.k, micro_batch=args.micro_batch,
      model=args.model, output=args.output), args.k * (args.windows + 1))


def _launch(args, bed, mode, directory):
  """Runs `mode` on the bed's hosts; returns each worker's step times."""
  outputs = [os.path.join(directory, f"{mode}_{i}.json")
             for i in range(args.workers)]
  task = [sys.executable, os.path.abspath(__file__), "--task", mode,
          "--k", str(args.k), "--micro_batch", str(args.micro_batch),
          "--model", args.model, "--windows", str(args.windows),
          *(["--heartbeat_seconds", str(args.heartbeat_seconds)]
            if args.heartbeat_seconds else []),
          "--model_dir", os.path.join(directory, mode.replace("+", "_")),
          "--output", os.path.join(directory, f"{mode}_{{index}}.json")]
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers",
       str(args.workers), "--netns", bed.name, "--timeout", "900", "--",
       *task], cwd=ROOT, capture_output=True, text=True)
  if result.returncode != 0 or not all(map(os.path.exists, outputs)):
    raise RuntimeError(f"{mode} failed:\n{result.stdout[-3000:]}"
                       f"{result.stderr[-3000:]}")
  return [json.load(open(path)) for path in outputs]


def summarize(times, k):
  """(window seconds, last-step share) from one worker's step times: the
  windows after the first (warm-up) one, medians."""
  windows = [times[i:i + k] for i in range(k, len(times) - k + 1, k)]
  window = statistics.median(sum(w) for w in windows)
  plain = statistics.median(s for w in windows for s in w[:-1]) if k > 1 else 0
  last = statistics.median(w[-1] for w in windows)
  return window, max(last - plain, 0.0) / window


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--task", choices=MODES)
  parser.add_argument("--model", default="minilm",
                      choices=["minilm", "bert_small"])
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--rates", default="none,10gbit,1gbit")
  parser.add_argument("--modes", default=",".join(MODES))
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=8)
  parser.add_argument("--windows", type=int, default=4)
  parser.add_argument("--heartbeat_seconds", type=float, default=None,
                      help="the coordination service's heartbeat timeout "
                      "(slow links; estimator_accum.distribution.health.coordination_heartbeat)")
  parser.add_argument("--model_dir")
  parser.add_argument("--output")
  args = parser.parse_args()
  if args.task:
    run_task(args)
    return 0
  reason = testbed.available()
  if reason:
    print(f"window_across_hosts: error: {reason}", file=sys.stderr)
    return 1
  modes = args.modes.split(",")
  rows = bench.Rows(
      f"{args.model}, {args.workers} workers (one per host), micro-batch "
      f"{args.micro_batch}, k={args.k}; medians over {args.windows - 1} "
      "windows after a warm-up one", args.json, markdown=True,
      formats={"window (s)": ".2f", "micro-batches/s per worker": ".2f",
               "last step beyond a micro-batch": ".0%"})
  for rate in args.rates.split(","):
    rate = None if rate == "none" else rate
    bed = testbed.TestBed(args.workers, name=f"{testbed.PREFIX}b{os.getpid()}",
                          rate=rate).up()
    try:
      with tempfile.TemporaryDirectory(prefix="across_hosts_") as directory:
        results = {}
        for mode in modes:
          per_worker = [summarize(t, args.k)
                        for t in _launch(args, bed, mode, directory)]
          results[mode] = (max(w for w, _ in per_worker),
                           max(s for _, s in per_worker))
        base = results.get("window", (None,))[0]
        for mode in modes:
          window, share = results[mode]
          ratio = f"{base / window:.2f}x" if base else "-"
          rows.add(**{"link": rate or "unshaped", "mode": mode,
                      "window (s)": window,
                      "micro-batches/s per worker": args.k / window,
                      "last step beyond a micro-batch": share,
                      "vs window": ratio})
    finally:
      bed.down()
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
