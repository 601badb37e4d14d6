"""One worker of a MultiWorkerMirroredStrategy Estimator job (for the tests).

Run by `python -m tfconfig launch --workers 2 -- python harness/multiworker_job.py
--model_dir D --optimizer adam [--clip_norm C]`. Each worker reads its shard of
the test data (examples w, w+2, ...), so micro-step j of the job covers the
same examples as slice j of 2*B in order, and window n the reference's big
batch n of 2*k*B. Worker 0 writes the final weights to D/final_weights.npz.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from estimator_accum.distribution import health  # noqa: E402
from harness import faults, support  # noqa: E402
from harness.collectives import (  # noqa: E402
  CollectiveCounter,
  CollectivesBeforeInput,
)
from harness.google_style_adamw import GoogleStyleAdamWeightDecay  # noqa: E402

OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.2, 0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    # Unwrapped by the library: its Adam applies, its dynamic scale scales.
    "keras_loss_scale_adam": lambda: tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.Adam(0.05)),
    # google-research/bert's shape: apply_gradients of its own, no merge.
    "google_adam_weight_decay": lambda: GoogleStyleAdamWeightDecay(
        0.05, weight_decay_rate=0.01),
}


class _SlowStep(tf.compat.v1.train.SessionRunHook):
  """Sleeps before this worker's n-th micro-batch of this run (the one that
  finds the input ended, to force the race at the job's end)."""

  def __init__(self, n, seconds):
    self._n, self._seconds, self._runs = n, seconds, 0

  def before_run(self, run_context):
    self._runs += 1
    if self._runs == self._n:
      time.sleep(self._seconds)


class _SlowEveryStep(tf.compat.v1.train.SessionRunHook):
  """Sleeps after every micro-batch: a job long enough to be killed in."""

  def __init__(self, seconds):
    self._seconds = seconds

  def after_run(self, run_context, run_values):
    time.sleep(self._seconds)


class _DieAfter(tf.compat.v1.train.SessionRunHook):
  """Kills this process after n micro-batches, leaving a marker file."""

  def __init__(self, n, marker):
    self._n, self._marker, self._runs = n, marker, 0

  def after_run(self, run_context, run_values):
    self._runs += 1
    if self._runs == self._n:
      open(self._marker, "w").close()
      print(f"dying after {self._n} micro-batches", flush=True)
      os._exit(3)


# The moments of a job's start a test can stop it at (--pause_at).
PHASES = ("imported", "strategy_made", "building_train_op", "session_made",
          "trained_one")


class _Phases(tf.compat.v1.train.SessionRunHook):
  """Says "phase <name>" at each moment of the start, and waits at the one
  it was asked to (a SIGTERM sent on seeing it lands there): `seconds`, or
  until `release` (a path) exists, at most `seconds`. A test that signals
  every task and then makes the file lets them all go on at once: each
  task's fixed sleep began when it got there, and two tasks' ends could
  lie seconds apart on a busy machine, where a task whose micro-batch
  waits 5 s on its peer takes the peer for lost."""

  def __init__(self, pause_at, seconds, release=None, lag=0.0):
    self._pause_at, self._seconds, self._runs = pause_at, seconds, 0
    self._release, self._lag = release, lag

  def __call__(self, name):
    print(f"phase {name}", flush=True)
    if name != self._pause_at:
      return
    if self._release is None:
      time.sleep(self._seconds)
    else:
      deadline = time.monotonic() + self._seconds
      while (not os.path.exists(self._release) and
             time.monotonic() < deadline):
        time.sleep(0.01)
    time.sleep(self._lag)

  def after_create_session(self, session, coord):
    self("session_made")

  def after_run(self, run_context, run_values):
    self._runs += 1
    if self._runs == 1:
      self("trained_one")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                      default="adam")
  parser.add_argument("--k", type=int, default=2)
  parser.add_argument("--micro_batch", type=int, default=4)
  parser.add_argument("--updates", type=int, default=3)
  parser.add_argument("--clip_norm", type=float, default=None)
  parser.add_argument("--control_flow", choices=["v1", "v2"], default="v2")
  parser.add_argument("--count_collectives", action="store_true")
  parser.add_argument("--collectives_before_input", action="store_true",
                      help="write the train op's collectives that do not "
                      "wait for the step's input to "
                      "collectives_before_input_<index>.json")
  parser.add_argument("--reportable_loss", default=None,
                      choices=["this_worker", "across_workers"],
                      help="give Estimator estimator_accum.reportable_loss "
                      "(with across_workers=True or not)")
  parser.add_argument("--record_losses", action="store_true",
                      help="write each worker's micro-batch losses to "
                      "D/losses_<index>.json and the chief's summaries "
                      "every step")
  parser.add_argument("--table_all_reduce", default="auto",
                      choices=["auto", "rows", "dense"],
                      help="how the embedding table's window is all-reduced")
  parser.add_argument("--communication_dtype", default=None,
                      help="the window's wire dtype (bfloat16, float16)")
  parser.add_argument("--bytes_per_pack", type=int, default=None,
                      help="the window all-reduce's pack size (default: the "
                      "library's)")
  parser.add_argument("--die_at", type=int, default=None,
                      help="worker 1 exits after this many micro-batches, "
                      "once (a marker file remembers it died)")
  parser.add_argument("--abort_at", type=int, default=None,
                      help="worker 1's step raises AbortedError after this "
                      "many micro-batches, once")
  parser.add_argument("--stall_at", type=int, default=None,
                      help="worker 1 sleeps an hour before this micro-batch, "
                      "once")
  parser.add_argument("--save_every", type=int, default=10_000)
  parser.add_argument("--end", default="train_and_evaluate",
                      choices=["train_and_evaluate", "stop_hook", "rounds"],
                      help="how the job ends: train_and_evaluate's max_steps "
                      "(or its input, with --until_input_ends), a "
                      "StopAtStepHook, or train() rounds with evaluations "
                      "between them")
  parser.add_argument("--step_seconds", type=float, default=0,
                      help="sleep this long after every micro-batch")
  parser.add_argument("--extra_micro_batches", type=int, default=0,
                      help="each worker's input holds this many micro-batches "
                      "past the last whole window")
  parser.add_argument("--slow_last_step", type=int, default=None,
                      metavar="INDEX",
                      help="worker INDEX sleeps 3 s before the micro-batch "
                      "that finds the input ended (with --until_input_ends)")
  parser.add_argument("--until_input_ends", action="store_true",
                      help="train until the finite input ends (no max_steps)")
  parser.add_argument("--accumulator_dtype", default="float32")
  parser.add_argument("--accumulator_placement", default="device")
  parser.add_argument("--recompute", action="store_true",
                      help="the hidden layer as an estimator_accum.recompute "
                      "block")
  parser.add_argument("--ema_decay", type=float, default=None,
                      help="also keep a moving average of the weights, "
                      "through after_update; saved with the weights")
  parser.add_argument("--batch_norm_momentum", type=float, default=None,
                      help="add a batch_norm layer on the features; its "
                      "moving statistics are saved with the weights")
  parser.add_argument("--peer_timeout", type=float,
                      default=health.DEFAULT_TIMEOUT,
                      help="seconds without an answer from a task before "
                      "this one exits (estimator_accum.distribution.health); 0: no watchdog")
  parser.add_argument("--peer_interval", type=float,
                      default=health.DEFAULT_INTERVAL)
  parser.add_argument("--strategy", default="multi_worker",
                      choices=["multi_worker", "mirrored", "none"],
                      help="mirrored (two replicas on two logical CPUs) and "
                      "none run in one process, without TF_CONFIG")
  parser.add_argument("--ballast_mb", type=int, default=0,
                      help="a variable of this many MB (zeros, not trained) "
                      "beside the model: each save takes seconds")
  parser.add_argument("--chief_seconds_after", type=float, default=0,
                      help="worker 0 works this long after training before "
                      "it finishes (as a chief that evaluates)")
  parser.add_argument("--pause_at", choices=PHASES, default=None,
                      help="say each phase of the start, and sleep "
                      "--pause_seconds at this one")
  parser.add_argument("--pause_seconds", type=float, default=5.0)
  parser.add_argument("--release_file", default=None,
                      help="the pause ends when this file exists (at most "
                      "--pause_seconds)")
  parser.add_argument("--first_task_lag", type=float, default=0.0,
                      help="task index 0 goes on this much later after the "
                      "pause (a long hook between two micro-batches)")
  args = parser.parse_args()
  tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
  phases = None
  if args.pause_at:
    first = tf_config.get("task", {}).get("index", 0) == 0
    phases = _Phases(args.pause_at, args.pause_seconds, args.release_file,
                     args.first_task_lag if first else 0.0)
    phases("imported")
  watchdog = None
  if args.peer_timeout > 0:
    watchdog = health.watch(args.model_dir, timeout=args.peer_timeout,
                            interval=min(args.peer_interval,
                                         args.peer_timeout))
  if args.control_flow == "v1":
    tf.compat.v1.disable_control_flow_v2()
  if args.clip_norm is not None and args.clip_norm <= 0:
    args.clip_norm = None

  if args.strategy == "multi_worker":
    workers = len(tf_config["cluster"]["worker"])
    task = tf_config["task"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if phases:
      phases("strategy_made")
  else:
    workers, task, strategy = 1, {"type": "worker", "index": 0}, None
    if args.strategy == "mirrored":
      cpu = tf.config.list_physical_devices("CPU")[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
      strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  # Each replica reads its own micro-batch.
  replicas = workers * (2 if args.strategy == "mirrored" else 1)
  data = support.make_data(replicas * args.micro_batch * (
      args.k * args.updates + args.extra_micro_batches))

  # A restarted job goes on from its checkpoint's step: skip the
  # micro-batches it already trained on (the pipeline is not checkpointed).
  latest = tf.train.latest_checkpoint(args.model_dir)
  start = int(latest.rsplit("-", 1)[1]) if latest else 0
  print(f"starting at micro-batch {start}", flush=True)

  def input_fn(input_context=None):
    # Each train() call goes on where the checkpoint it starts from is.
    latest = tf.train.latest_checkpoint(args.model_dir)
    done = int(latest.rsplit("-", 1)[1]) if latest else 0
    features = {key: value for key, value in data.items() if key != "labels"}
    dataset = tf.data.Dataset.from_tensor_slices((features, data["labels"]))
    if input_context is not None:
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    # Each step takes one micro-batch per replica of this worker.
    dataset = dataset.batch(args.micro_batch).skip(done * (replicas //
                                                           workers))
    return dataset if args.until_input_ends else dataset.repeat()

  counter = None
  dier = None
  marker = os.path.join(args.model_dir, "worker_1_died")
  if (args.die_at is not None and task["index"] == 1
      and not os.path.exists(marker)):
    dier = _DieAfter(args.die_at, marker)
  if args.stall_at is not None and task["index"] == 1:
    dier = faults.StallOnce(args.stall_at,
                            os.path.join(args.model_dir, "worker_1_stalled"))
  if args.abort_at is not None and task["index"] == 1:
    dier = faults.AbortOnce(args.abort_at,
                            os.path.join(args.model_dir, "worker_1_aborted"))
  before_input = CollectivesBeforeInput(os.path.join(
      args.model_dir, f"collectives_before_input_{task['index']}.json")) if (
          args.collectives_before_input) else None
  if args.count_collectives:
    counter = CollectiveCounter(os.path.join(
        args.model_dir, f"collectives_{task['index']}.json"))
  recorder = None
  slow = None
  if args.slow_last_step == task["index"]:
    per_worker = args.k * args.updates + args.extra_micro_batches - start
    slow = _SlowStep(per_worker + 1, 3.0)
  if args.record_losses:
    recorder = support.LossRecorder(os.path.join(
        args.model_dir, f"losses_{task['index']}.json"))
  config = tf.estimator.RunConfig(
      model_dir=args.model_dir, train_distribute=strategy, tf_random_seed=0,
      save_checkpoints_steps=args.save_every, log_step_count_steps=10_000,
      save_summary_steps=1 if args.record_losses else 100,
      # Graph sessions see one CPU unless told (the second replica's).
      session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}) if
      args.strategy == "mirrored" else None)
  def model_fn(features, labels, mode, params):
    if phases and mode == tf.estimator.ModeKeys.TRAIN:
      phases("building_train_op")
    if args.ballast_mb:
      tf.compat.v1.get_variable(
          "ballast", [args.ballast_mb, 1024, 256], trainable=False,
          initializer=tf.compat.v1.zeros_initializer())
    return support.accumulating_model_fn(features, labels, mode, params)

  estimator = tf.estimator.Estimator(
      model_fn, config=config,
      params=dict(optimizer_fn=OPTIMIZERS[args.optimizer], k=args.k,
                  clip_norm=args.clip_norm, bytes_per_pack=args.bytes_per_pack,
                  table_all_reduce=args.table_all_reduce,
                  communication_dtype=args.communication_dtype,
                  ema_decay=args.ema_decay,
                  batch_norm_momentum=args.batch_norm_momentum,
                  accumulator_dtype=tf.as_dtype(args.accumulator_dtype),
                  reportable_loss=args.reportable_loss,
                  recompute=args.recompute,
                  accumulator_placement=args.accumulator_placement,
                  training_hooks=[h for h in (
                      counter, dier, recorder, slow, phases, before_input,
                      args.step_seconds and _SlowEveryStep(args.step_seconds))
                                  if h]))
  total = args.k * args.updates

  def train(max_steps=None, hooks=None):
    if args.strategy != "multi_worker":
      estimator.train(input_fn, max_steps=max_steps, hooks=hooks)
      return
    # Under TF_CONFIG, Estimator trains with a strategy only through
    # train_and_evaluate.
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn, max_steps=max_steps,
                                          hooks=hooks),
        tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                              throttle_secs=0))

  if args.end == "stop_hook":
    # The input repeats; a hook, not max_steps, ends the job.
    train(hooks=[tf.compat.v1.train.StopAtStepHook(last_step=total)])
  elif args.end == "rounds":
    # Training in rounds with an evaluation between them (one window and a
    # half per round: a round ends in the middle of a window).
    for steps in range(args.k + args.k // 2, total, args.k + args.k // 2):
      train(max_steps=steps)
      estimator.evaluate(input_fn, steps=1)
    train(max_steps=total)
  else:
    train(max_steps=None if args.until_input_ends else total)
  if task["index"] == 0:
    names = support.weight_names()
    if args.ema_decay is not None:
      names += [n + "/ExponentialMovingAverage" for n in names]
    if args.batch_norm_momentum is not None:
      names += ["bn/moving_mean", "bn/moving_variance"]
    weights = {name: estimator.get_variable_value(name) for name in names}
    weights["global_step"] = estimator.get_variable_value("global_step")
    np.savez(os.path.join(args.model_dir, "final_weights.npz"),
             **{n.replace("/", "__"): v for n, v in weights.items()})
    print("saved final weights at global step", weights["global_step"])
  if task["index"] == 0 and args.chief_seconds_after:
    time.sleep(args.chief_seconds_after)
  if watchdog:
    watchdog.finish()
  print(f"worker {task['index']} leaves", flush=True)


if __name__ == "__main__":
  main()
