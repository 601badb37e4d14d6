"""Time per window on 2 local workers against its reference measured in the
same processes, interleaved step by step.

Issue 3's goal: on 2 workers with k=8 the time per window is within 10% of
8 x the forward+backward time of one micro-batch plus one all-reduce.
`multiworker_window.py` measures the window and each reference in jobs of
their own, one after the other; on this shared 2-core machine its rounds
move by more than the 10% the goal allows (the same variant, minutes
apart, 0.99 to 1.16). Here one Estimator job measures all three at once,
on each of its 2 workers (MultiWorkerMirroredStrategy, one thread per
task, Adam, k=8), so that a change of machine speed moves the window and
its reference together:

  step         every micro-batch of the accumulating train op, timed by a
               hook as Estimator runs it (the 8th of a window applies);
               each worker reports its own loss (reportable_loss), as the
               README recommends: no collective between window ends
  pass         after every step the hook runs, in the same session, an op
               computing the micro-batch's forward+backward pass and
               nothing else (tf.gradients of the same loss)
  all-reduce   after every window's last step both workers run a batched
               all-reduce of tensors of the gradients' shapes, packed as
               the window packs it (4 MB packs)

Per window: window / (k x median pass in that window + that all-reduce);
printed as the median over the windows after the first, of both workers.
The reference runs as a bare session.run, without Estimator's per-step hooks
that the window's steps pay: if anything the ratio is overstated.

  python benchmarks/multiworker_interleaved.py [--model mlp|bert_small]
      [--micro_batch 64] [--windows 8] [--k 8]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from benchmarks.accumulation_overhead import MODELS  # noqa: E402
from benchmarks.multiworker_window import MODEL_CHOICES, fetch_all  # noqa: E402
from estimator_accum.options import BYTES_PER_PACK  # noqa: E402
from harness import bench  # noqa: E402


class _InterleavedTimer(tf.compat.v1.train.SessionRunHook):
  """Times every step, then the pass alone, and after every k-th step the
  all-reduce alone; writes the three lists as JSON at the end."""

  def __init__(self, k, pass_tensor, reduce_tensor, path):
    self._k = k
    self._pass, self._reduce = pass_tensor, reduce_tensor
    self._path = path
    self._times = {"steps": [], "passes": [], "reduces": []}
    self._start = None

  def before_run(self, run_context):
    self._start = time.perf_counter()

  def after_run(self, run_context, run_values):
    now = time.perf_counter()
    self._times["steps"].append(now - self._start)
    self._times["passes"].append(self._timed(run_context.session, self._pass))
    if len(self._times["steps"]) % self._k == 0:
      self._times["reduces"].append(
          self._timed(run_context.session, self._reduce))

  @staticmethod
  def _timed(session, tensor):
    start = time.perf_counter()
    session.run(tensor)
    return time.perf_counter() - start

  def end(self, session):
    with open(self._path, "w") as writer:
      json.dump(self._times, writer)


def model_fn(features, labels, mode, params):
  del features, labels
  loss = MODELS[params["model"]](batch_size=params["micro_batch"])
  variables = tf.compat.v1.trainable_variables()
  # The reference ops first: the window's gradients must not be theirs.
  pass_tensor = fetch_all(tf.compat.v1.gradients(loss, variables))
  seed = tf.cast(tf.compat.v1.train.get_or_create_global_step(), tf.float32)
  # Tensors shaped like the gradients, not constants (which Grappler would
  # fold), all-reduced as the window's are.
  reduced = tf.distribute.get_replica_context().all_reduce(
      tf.distribute.ReduceOp.SUM, [tf.fill(v.shape, seed) for v in variables],
      options=tf.distribute.experimental.CommunicationOptions(
          bytes_per_pack=BYTES_PER_PACK))
  train_op = estimator_accum.build_accumulating_train_op(
      loss, tf.compat.v1.train.AdamOptimizer(1e-4), params["k"],
      summaries=False)
  return tf.estimator.EstimatorSpec(
      mode, loss=estimator_accum.reportable_loss(loss), train_op=train_op,
      training_hooks=[_InterleavedTimer(params["k"], pass_tensor,
                                        fetch_all(reduced),
                                        params["output"])])


def run_task(args):
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  warnings.simplefilter("ignore", UserWarning)
  index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  config = tf.estimator.RunConfig(
      model_dir=args.model_dir,
      train_distribute=tf.distribute.MultiWorkerMirroredStrategy(),
      tf_random_seed=0, save_checkpoints_steps=1_000_000,
      save_summary_steps=1_000_000, log_step_count_steps=1_000_000,
      session_config=estimator_accum.own_threads(tf.compat.v1.ConfigProto(
          intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)))
  estimator = tf.estimator.Estimator(model_fn, config=config, params=dict(
      model=args.model, micro_batch=args.micro_batch, k=args.k,
      output=args.output.format(index=index)))

  def input_fn(input_context=None):
    del input_context
    return tf.data.Dataset.from_tensors(({"x": 0.0}, 0)).repeat()

  tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(input_fn, max_steps=args.k * (args.windows + 1)),
      tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0,
                            throttle_secs=0))


def window_ratios(times, k):
  """Per window after the first: (window, reference, accumulate steps'
  median / the window's median pass, apply step / (pass + all-reduce))."""
  steps, passes, reduces = times["steps"], times["passes"], times["reduces"]
  out = []
  for window in range(1, len(steps) // k):
    span = slice(window * k, (window + 1) * k)
    pass_time = statistics.median(passes[span])
    reference = k * pass_time + reduces[window]
    out.append((sum(steps[span]), reference,
                statistics.median(steps[span][:-1]) / pass_time,
                steps[span][-1] / (pass_time + reduces[window])))
  return out


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--model", choices=sorted(MODEL_CHOICES), default="mlp")
  parser.add_argument("--micro_batch", type=int, default=None,
                      help="default: 64 for the MLP, 8 for BERT-Small")
  parser.add_argument("--k", type=int, default=8)
  parser.add_argument("--windows", type=int, default=8)
  parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--model_dir", help=argparse.SUPPRESS)
  parser.add_argument("--output", help=argparse.SUPPRESS)
  args = parser.parse_args()
  description, default_micro_batch = MODEL_CHOICES[args.model]
  if args.micro_batch is None:
    args.micro_batch = default_micro_batch
  if args.task:
    run_task(args)
    return 0
  with tempfile.TemporaryDirectory() as directory:
    output = os.path.join(directory, "times_{index}.json")
    subprocess.run(
        [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
         "--timeout", "3600", "--", sys.executable, __file__, "--task",
         "--model", args.model, "--micro_batch", str(args.micro_batch),
         "--k", str(args.k), "--windows", str(args.windows),
         "--model_dir", os.path.join(directory, "model"),
         "--output", output],
        check=True, capture_output=True, text=True)
    workers = [json.load(open(output.format(index=i))) for i in range(2)]
  per_worker = [window_ratios(times, args.k) for times in workers]
  reference = f"{args.k} x pass + all-reduce ms"
  rows = bench.Rows(
      f"{os.cpu_count()} cores; {description}, micro-batch "
      f"{args.micro_batch}, Adam, k={args.k}, 2 workers "
      "(MultiWorkerMirroredStrategy), one thread per task; the pass and "
      "the all-reduce timed between the window's steps in the same "
      f"processes; {args.windows} windows after one warm-up", args.json,
      markdown=True, formats={"window ms": ".1f", reference: ".1f"})
  everything = []
  for index, windows in enumerate(per_worker):
    everything += windows
    ratios = sorted(w / r for w, r, _, _ in windows)
    rows.add(**{
        "worker": index,
        "window ms": statistics.median(w for w, _, _, _ in windows) * 1e3,
        reference: statistics.median(r for _, r, _, _ in windows) * 1e3,
        "window / reference (per window)":
            f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-"
            f"{ratios[-1]:.3f})",
        "accumulate step / pass":
            statistics.median(a for _, _, a, _ in windows),
        "apply step / (pass + all-reduce)":
            statistics.median(a for _, _, _, a in windows)})
  ratios = [w / r for w, r, _, _ in everything]
  print(f"window / ({args.k} x pass + all-reduce) = "
        f"{statistics.median(ratios):.3f}, median over {len(ratios)} windows "
        f"of both workers (goal: at most 1.10)")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
