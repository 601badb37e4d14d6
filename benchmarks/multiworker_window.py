"""Time per window on 2 local workers (MultiWorkerMirroredStrategy), k=8,
against 8 x the forward+backward time of one micro-batch plus one all-reduce.

Every figure comes from a real Estimator run of the same model (the MLP of
3.2M parameters at micro-batch 64, or --model bert_small: BERT-Small, 28.8M
parameters, 128 tokens, micro-batch 8), Adam, one thread per task, timed per
session.run by a hook, medians over windows after a warm-up window:

  window       2 workers, build_accumulating_train_op(k=8): the sum of the
               8 micro-batch steps of each window (the 8th applies), the
               loss given to Estimator as reportable_loss(loss) (each
               worker reports its own: between window ends only the stop
               flag, one float32 scalar per micro-batch, crosses workers)
  window, loss across workers
               the same with reportable_loss(loss, across_workers=True):
               Estimator all-reduces the reported loss at every micro-batch
  window, no stop flag
               the same with ESTIMATOR_ACCUM_STOP_ON_SIGTERM=0: no stop flag
               all-reduced at every micro-batch (docs/operations.md)
  fwd+bwd      one worker alone, no strategy: a step that computes the
               gradients and nothing else; also with two such processes at
               once, as the two workers share this machine; and on the 2
               workers under the strategy, each reporting its own loss as
               the window's workers do (no collective at all): the pass in
               the conditions of the window's steps
  all-reduce   2 workers: a step that all-reduces tensors of the gradients'
               shapes in one batched all-reduce: TensorFlow's default (one
               pack), and packed as the window packs it (4 MB packs)

  python benchmarks/multiworker_window.py [--k 8 --windows 8 --micro_batch 64]
      [--rounds N]           # N rounds of every variant; ratios per round
      [--bytes_per_pack N]   # the window's packs (0: one pack)
  python benchmarks/multiworker_window.py --model bert_small --windows 3

Printed: window / (k x fwd+bwd + all-reduce), for fwd+bwd alone and shared.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.accumulation_overhead import MODELS  # noqa: E402
from estimator_accum.options import BYTES_PER_PACK  # noqa: E402
from harness import bench  # noqa: E402

MODES = ("window", "window_loss_across", "window_no_stop_flag",
         "forward_backward", "all_reduce", "all_reduce_packed")
# Model -> (description, default micro-batch).
MODEL_CHOICES = {
    "mlp": ("MLP 3.2M parameters", 64),
    "bert_small": ("BERT-Small 28.8M parameters, 128 tokens", 8),
}


def fetch_all(tensors):
  """One scalar needing every tensor whole (a group would be pruned).

  An embedding's tf.IndexedSlices gradient is taken as its rows: densifying
  it would add work the pass does not do.
  """
  tensors = [t.values if isinstance(t, tf.IndexedSlices) else t
             for t in tensors]
  return tf.add_n([tf.reshape(t, [-1])[0] for t in tensors])


def model_fn(features, labels, mode, params):
  del features, labels
  loss = MODELS[params["model"]](batch_size=params["micro_batch"])
  step = tf.compat.v1.train.get_or_create_global_step()
  variables = tf.compat.v1.trainable_variables()
  reported = tf.identity(loss)
  if params["mode"].startswith("window"):
    options = None
    if params["bytes_per_pack"] is not None:
      options = tf.distribute.experimental.CommunicationOptions(
          bytes_per_pack=params["bytes_per_pack"])
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(1e-4), params["k"],
        summaries=False, communication_options=options)
    reported = estimator_accum.reportable_loss(
        loss, across_workers=params["mode"] == "window_loss_across")
  else:
    if params["mode"] == "forward_backward":
      done = fetch_all(tf.compat.v1.gradients(loss, variables))
      if tf.distribute.get_strategy().num_replicas_in_sync > 1:
        # Report each worker's own loss, as the window does: the reference
        # pass then runs no collective either. Estimator means the
        # replicas' losses only in a graph whose loss an optimizer scaled,
        # and reportable_loss keeps its value on the worker only then; this
        # graph has no optimizer, so it is marked as the library marks its
        # own (train_op.py).
        tf.compat.v1.get_default_graph()._is_loss_scaled_by_optimizer = True  # noqa: SLF001
        reported = estimator_accum.reportable_loss(loss)
    else:
      # Tensors shaped like the gradients, not constants (which Grappler
      # would fold), all-reduced in one batch.
      seed = tf.cast(step, tf.float32)
      options = None
      if params["mode"] == "all_reduce_packed":
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=BYTES_PER_PACK)
      reduced = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM,
          [tf.fill(v.shape, seed) for v in variables], options=options)
      done = fetch_all(reduced)
    # A data dependency: under a control dependency Grappler was found to
    # skip the gradients (0.1 ms a step instead of 29).
    train_op = step.assign_add(1 + tf.cast(tf.math.is_nan(done), tf.int64))
  return tf.estimator.EstimatorSpec(
      mode, loss=reported, train_op=train_op,
      training_hooks=[bench.StepTimer(params["output"])])


def run_task(mode, model_dir, output, k, steps, micro_batch,
             bytes_per_pack=None, model="mlp"):
  # The tasks' deprecation warnings would bury the figures.
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  warnings.simplefilter("ignore", UserWarning)
  distributed = "TF_CONFIG" in os.environ
  strategy = (tf.distribute.MultiWorkerMirroredStrategy() if distributed
              else None)
  config = tf.estimator.RunConfig(
      model_dir=model_dir, train_distribute=strategy, tf_random_seed=0,
      save_checkpoints_steps=1_000_000, save_summary_steps=1_000_000,
      log_step_count_steps=1_000_000,
      session_config=estimator_accum.own_threads(tf.compat.v1.ConfigProto(
          intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)))
  estimator = tf.estimator.Estimator(
      model_fn, config=config, params=dict(mode=mode, k=k, output=output,
                                   micro_batch=micro_batch, model=model,
                                   bytes_per_pack=bytes_per_pack))

  def input_fn(input_context=None):
    del input_context
    return tf.data.Dataset.from_tensors(({"x": 0.0}, 0)).repeat()

  if distributed:
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=steps),
        tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                              throttle_secs=0))
  else:
    estimator.train(input_fn, max_steps=steps)


def _launch(args, mode, workers, directory, cluster=False):
  """Runs `mode` on `workers` tasks; returns each task's step times."""
  outputs = [os.path.join(directory, f"{mode}_{workers}_{i}.json")
             for i in range(workers)]
  task = [sys.executable, __file__, "--task", mode, "--k", str(args.k),
          "--micro_batch", str(args.micro_batch), "--model", args.model,
          "--steps", str(args.k * (args.windows + 1))]
  if args.bytes_per_pack is not None:
    task += ["--bytes_per_pack", str(args.bytes_per_pack)]
  if mode == "forward_backward" and not cluster:
    # Independent processes without a cluster: one alone, or two at once.
    processes = [subprocess.Popen(
        task + ["--model_dir", os.path.join(directory, f"fb{workers}_{i}"),
                "--output", outputs[i]],
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
        for i in range(workers)]
    for process in processes:
      if process.wait() != 0:
        raise RuntimeError(f"{mode} task failed")
  else:
    subprocess.run(
        [sys.executable, "-m", "tfconfig", "launch", "--workers",
         str(workers), "--timeout", "600", "--", *task, "--model_dir",
         os.path.join(directory, mode), "--output",
         os.path.join(directory, f"{mode}_{workers}_{{index}}.json")],
        check=True, capture_output=True, text=True,
        env=dict(os.environ, ESTIMATOR_ACCUM_STOP_ON_SIGTERM="0") if
        mode == "window_no_stop_flag" else None)
  return [json.load(open(path)) for path in outputs]


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--k", type=int, default=8)
  parser.add_argument("--windows", type=int, default=8)
  parser.add_argument("--rounds", type=int, default=1,
                      help="repeat every variant this many times, one round "
                      "after the other, and print each round's ratios and "
                      "their median (this machine is shared and noisy)")
  parser.add_argument("--model", choices=sorted(MODEL_CHOICES), default="mlp")
  parser.add_argument("--micro_batch", type=int, default=None,
                      help="default: 64 for the MLP, 8 for BERT-Small")
  parser.add_argument("--bytes_per_pack", type=int, default=None,
                      help="the window all-reduce's packs (default: the "
                      "library's; 0: one pack)")
  parser.add_argument("--task", choices=MODES, help=argparse.SUPPRESS)
  parser.add_argument("--model_dir", help=argparse.SUPPRESS)
  parser.add_argument("--output", help=argparse.SUPPRESS)
  parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  description, default_micro_batch = MODEL_CHOICES[args.model]
  if args.micro_batch is None:
    args.micro_batch = default_micro_batch
  if args.task:
    output = args.output
    if "{index}" in output:
      output = output.format(
          index=json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    run_task(args.task, args.model_dir, output, args.k, args.steps,
             args.micro_batch, args.bytes_per_pack, args.model)
    return 0
  k = args.k
  rounds = []
  for number in range(args.rounds):
    with tempfile.TemporaryDirectory() as directory:
      rounds.append(_measure_round(args, directory))
    if args.rounds > 1:
      print(f"round {number + 1}: " + ", ".join(
          f"{name} {value:.3f}" for name, value in _ratios(rounds[-1], k)),
            flush=True)
  figures = {name: statistics.median(r[name] for r in rounds)
             for name in rounds[0]}
  over = f"the median of {args.rounds} rounds of " if args.rounds > 1 else ""
  rows = bench.Rows(
      f"{os.cpu_count()} cores; {description}, micro-batch "
      f"{args.micro_batch}, Adam, k={k}, 2 workers "
      "(MultiWorkerMirroredStrategy), one thread per task; "
      f"{over}medians over {args.windows} windows after one warm-up",
      args.json, markdown=True, formats={"ms": ".1f"})
  for name, label in FIGURES:
    rows.add(figure=label.format(k=k, pack=BYTES_PER_PACK // 2**20),
             ms=1000 * figures[name])
  ratios = [dict(_ratios(r, k)) for r in rounds]
  for name in ratios[0]:
    values = sorted(r[name] for r in ratios)
    spread = (f" (rounds: {', '.join(f'{v:.3f}' for v in values)})"
              if len(values) > 1 else "")
    print(f"{name} = {statistics.median(values):.3f}{spread}")
  return rows.exit_code()


# Figure name -> its label in the printed table.
FIGURES = (
    ("window", "window (2 workers, k={k})"),
    ("window_loss_across", "window, the reported loss all-reduced every "
                           "micro-batch (2 workers, k={k})"),
    ("window_no_stop_flag", "window without the stop flag's all-reduce "
                            "every micro-batch (2 workers, k={k})"),
    ("accumulate", "accumulate-only micro-batch (2 workers)"),
    ("apply", "apply micro-batch, all-reduce included (2 workers)"),
    ("fb_alone", "fwd+bwd per micro-batch, one worker alone"),
    ("fb_shared", "fwd+bwd per micro-batch, two processes at once"),
    ("fb_cluster", "fwd+bwd step under the 2-worker strategy (each worker "
                   "reporting its own loss, as the window: no collective)"),
    ("all_reduce", "one all-reduce of the gradients, one pack (TensorFlow's "
                   "default; 2 workers)"),
    ("all_reduce_packed", "one all-reduce of the gradients, {pack} MB packs, "
                          "the library's default (2 workers)"),
)


def _measure_round(args, directory):
  """One run of every variant, one after the other; returns seconds."""
  k = args.k
  windows = _launch(args, "window", 2, directory)
  across = _launch(args, "window_loss_across", 2, directory)
  no_stop = _launch(args, "window_no_stop_flag", 2, directory)
  reduce_steps = _launch(args, "all_reduce", 2, directory)
  packed_steps = _launch(args, "all_reduce_packed", 2, directory)
  alone = _launch(args, "forward_backward", 1, directory)
  shared = _launch(args, "forward_backward", 2, directory)
  in_cluster = _launch(args, "forward_backward", 2, directory, cluster=True)
  # Skip the first window (graph warm-up); windows end at steps k, 2k, ...
  def window_times(runs):
    return [sum(times[i:i + k]) for times in runs
            for i in range(k, len(times) - k + 1, k)]

  apply_steps = [times[i] for times in windows
                 for i in range(2 * k - 1, len(times), k)]
  accumulate_steps = [t for times in windows
                      for i, t in enumerate(times[k:], k) if (i + 1) % k]
  later = lambda runs: [t for times in runs for t in times[k:]]  # noqa: E731
  return {
      "window": statistics.median(window_times(windows)),
      "window_loss_across": statistics.median(window_times(across)),
      "window_no_stop_flag": statistics.median(window_times(no_stop)),
      "accumulate": statistics.median(accumulate_steps),
      "apply": statistics.median(apply_steps),
      "fb_alone": statistics.median(alone[0][k:]),
      "fb_shared": statistics.median(later(shared)),
      "fb_cluster": statistics.median(later(in_cluster)),
      "all_reduce": statistics.median(later(reduce_steps)),
      "all_reduce_packed": statistics.median(later(packed_steps)),
  }


def _ratios(figures, k):
  """(label, window / (k x fwd+bwd + all-reduce)) for each reference."""
  out = []
  for label, fb in (("alone", "fb_alone"), ("shared", "fb_shared"),
                    ("under the strategy", "fb_cluster")):
    for pack_label, reduce in (("one pack", "all_reduce"),
                               ("packed", "all_reduce_packed")):
      out.append((f"window / ({k} x fwd+bwd {label} + all-reduce "
                  f"{pack_label})",
                  figures["window"] / (k * figures[fb] + figures[reduce])))
  out.append(("window, loss across workers / window",
              figures["window_loss_across"] / figures["window"]))
  out.append(("window / window without the stop flag",
              figures["window"] / figures["window_no_stop_flag"]))
  return out


if __name__ == "__main__":
  sys.exit(main())
