"""The window's all-reduce against the last micro-batch's backward pass, in
a timeline traced on a real 2-worker job.

An Estimator job under MultiWorkerMirroredStrategy (`python -m tfconfig
launch`, each worker in a network namespace of the test bed with --rate,
or on loopback with --loopback) trains BERT shapes on random tokens (128
tokens, micro-batch 8, Adam, k=4). A hook traces (RunOptions FULL_TRACE)
the last micro-batch of the windows after a warm-up window, on every
worker, with the window's end overlapping the backward pass
(`overlap_backward=True`, the default) and without (False), side by side
on the same link. From worker 0's traces it prints, for each mode, the
medians over the traced windows of:

  backward ends     when the micro-batch's last gradient op ends
  first pack        when the first all-reduce of the window starts
  last pack ends    when the last all-reduce of the window ends
  step              the whole micro-batch (session.run)

(milliseconds from the step's first op), and writes the timeline of one
traced step per mode as a picture (--figure, default
docs/overlap_trace.png: each op a bar on its thread, gradient ops grey,
the accumulators' adds blue, the window's all-reduces orange) and as a
Chrome trace (--chrome_trace DIR, for chrome://tracing or Perfetto).

  python benchmarks/overlap_trace.py [--model minilm] [--rate 1gbit]
      [--loopback] [--windows 4] [--figure docs/overlap_trace.png]

Needs root and iproute2 for the test bed (not with --loopback).
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
from benchmarks.window_across_hosts import train_on_workers  # noqa: E402
from estimator_accum.distribution import health  # noqa: E402
from harness import bench  # noqa: E402
from tfconfig import testbed  # noqa: E402

MODES = {"overlap": True, "no_overlap": False}
_COLLECTIVES = ("CollectiveReduceV2", "CollectiveReduce")


class _Tracer(tf.compat.v1.train.SessionRunHook):
  """Traces the steps in `steps` (0-based micro-batches); writes each
  traced step's ops as JSON: [[name, type, thread, start us, end us]]."""

  def __init__(self, steps, path):
    self._steps, self._path = set(steps), path
    self._step, self._traced = 0, []

  def before_run(self, run_context):
    del run_context
    if self._step in self._steps:
      return tf.compat.v1.train.SessionRunArgs(None, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    del run_context
    if self._step in self._steps:
      ops = []
      for device in run_values.run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
          kind = node.timeline_label.split("(")[0].split(" = ")[-1].strip()
          start = node.all_start_micros
          ops.append([node.node_name, kind, node.thread_id, start,
                      start + max(node.all_end_rel_micros, 1)])
      self._traced.append(ops)
    self._step += 1

  def end(self, session):
    del session
    with open(self._path, "w") as writer:
      json.dump(self._traced, writer)


def model_fn(features, labels, mode, params):
  del features, labels, mode
  loss = MODELS[params["model"]](batch_size=params["micro_batch"])
  optimizer = tf.compat.v1.train.AdamOptimizer(1e-5)
  reported = estimator_accum.reportable_loss(loss)
  train_op = estimator_accum.build_accumulating_train_op(
      loss, optimizer, params["k"], summaries=False,
      log_every_n_micro_batches=None,
      overlap_backward=MODES[params["mode"]])
  k, windows = params["k"], params["windows"]
  traced = [w * k + k - 1 for w in range(1, windows)]
  return tf.estimator.EstimatorSpec(
      tf.estimator.ModeKeys.TRAIN, loss=reported, train_op=train_op,
      training_hooks=[_Tracer(traced, params["output"].format(
          index=params["index"]))])


def run_task(args):
  """One worker of one mode (run by the launcher)."""
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  warnings.simplefilter("ignore", UserWarning)
  health.coordination_heartbeat(60)
  train_on_workers(model_fn, args.model_dir, dict(
      mode=args.task, k=args.k, micro_batch=args.micro_batch,
      model=args.model, windows=args.windows, output=args.output),
                   args.k * args.windows)


def _launch(args, prefix, mode, directory):
  """Runs `mode`; returns worker 0's traced steps."""
  output = os.path.join(directory, f"{mode}_{{index}}.json")
  task = [sys.executable, os.path.abspath(__file__), "--task", mode,
          "--k", str(args.k), "--micro_batch", str(args.micro_batch),
          "--model", args.model, "--windows", str(args.windows),
          "--model_dir", os.path.join(directory, mode), "--output", output]
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       *prefix, "--timeout", "900", "--", *task],
      cwd=ROOT, capture_output=True, text=True)
  first = output.format(index=0)
  if result.returncode != 0 or not os.path.exists(first):
    raise RuntimeError(f"{mode} failed:\n{result.stdout[-3000:]}"
                       f"{result.stderr[-3000:]}")
  with open(first) as reader:
    return json.load(reader)


def _is_gradient(name):
  """An op of the backward pass (tf.gradients' scope), not of the window."""
  return "gradients/" in name and "end_of_window" not in name


_ADDS = ("ResourceApplyGradientDescent", "ResourceScatterAdd",
         "AssignAddVariableOp")


def _is_add(name, kind):
  """An op adding the micro-batch to the accumulators."""
  return kind in _ADDS and "end_of_window" not in name


def _is_window_collective(name, kind):
  return kind.startswith(_COLLECTIVES) and "end_of_window" in name


def timings(ops):
  """{figure: milliseconds from the step's first op} of one traced step."""
  start = min(op[3] for op in ops)
  backward_end = max(op[4] for op in ops if _is_gradient(op[0]))
  packs = [op for op in ops if _is_window_collective(op[0], op[1])]
  if not packs:
    raise RuntimeError("the traced step ran no window all-reduce")
  return {
      "backward ends": (backward_end - start) / 1e3,
      "first pack": (min(op[3] for op in packs) - start) / 1e3,
      "last pack ends": (max(op[4] for op in packs) - start) / 1e3,
      "step": (max(op[4] for op in ops) - start) / 1e3,
      "packs": len(packs),
  }


def chrome_trace(ops, path):
  """Writes `ops` in the Chrome trace event format."""
  events = [{"name": name, "cat": kind, "ph": "X", "pid": 0, "tid": thread,
             "ts": begin, "dur": end - begin, "args": {"op": kind}}
            for name, kind, thread, begin, end in ops]
  with open(path, "w") as writer:
    json.dump({"traceEvents": events}, writer)


def figure(traces, path, title):
  """One panel per mode, one row per kind of op: the backward pass's ops,
  the accumulators' adds, and each of the window's all-reduce packs (from
  its launch to its result, waiting for the other worker included)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = max(len([o for o in ops if _is_window_collective(o[0], o[1])])
             for ops in traces.values()) + 2
  fig, axes = plt.subplots(len(traces), 1, sharex=True, squeeze=False,
                           figsize=(11, 0.9 + 0.28 * rows * len(traces)))
  for axis, (mode, ops) in zip(axes[:, 0], traces.items()):
    start = min(op[3] for op in ops)
    packs = sorted((o for o in ops if _is_window_collective(o[0], o[1])),
                   key=lambda o: o[3])
    lanes = [("backward", "0.55", [o for o in ops if _is_gradient(o[0])]),
             ("adds", "tab:blue", [o for o in ops if _is_add(o[0], o[1])])]
    lanes += [(f"pack {i + 1}", "tab:orange", [o])
              for i, o in enumerate(packs)]
    for row, (_, color, bars) in enumerate(lanes):
      axis.broken_barh([((o[3] - start) / 1e3, max((o[4] - o[3]) / 1e3, 0.5))
                        for o in bars], (row - 0.4, 0.8), color=color)
    marks = timings(ops)
    axis.axvline(marks["backward ends"], color="black", linestyle="--",
                 linewidth=1)
    axis.set_yticks(range(len(lanes)), [lane[0] for lane in lanes],
                    fontsize=7)
    axis.invert_yaxis()
    axis.set_title(f"{mode}: first pack at {marks['first pack']:.0f} ms, "
                   f"backward ends at {marks['backward ends']:.0f} ms "
                   f"(dashed), step {marks['step']:.0f} ms", fontsize=9)
  axes[-1, 0].set_xlabel("ms from the step's first op (worker 0)")
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--task", choices=sorted(MODES))
  parser.add_argument("--model", default="minilm",
                      choices=["minilm", "bert_small", "mlp"])
  parser.add_argument("--rate", default="1gbit",
                      help="the test bed's link rate (tc), or 'none'")
  parser.add_argument("--loopback", action="store_true",
                      help="both workers on loopback, no test bed")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=8)
  parser.add_argument("--windows", type=int, default=4)
  parser.add_argument("--figure", default=os.path.join(
      ROOT, "docs", "overlap_trace.png"))
  parser.add_argument("--chrome_trace", default=None,
                      help="a folder for one Chrome trace per mode")
  parser.add_argument("--model_dir")
  parser.add_argument("--output")
  args = parser.parse_args()
  if args.task:
    run_task(args)
    return 0
  if args.windows < 2:
    parser.error(f"--windows must be at least 2 (a warm-up window, then "
                 f"traced ones), got {args.windows}")
  rate = None if args.rate == "none" else args.rate
  bed = None
  prefix = []
  if not args.loopback:
    reason = testbed.available()
    if reason:
      print(f"overlap_trace: error: {reason} (or pass --loopback)",
            file=sys.stderr)
      return 1
    bed = testbed.TestBed(2, name=f"{testbed.PREFIX}o{os.getpid()}",
                          rate=rate).up()
    prefix = ["--netns", bed.name]
  link = "loopback" if args.loopback else (rate or "unshaped")
  title = (f"{args.model}, 2 workers ({link}), micro-batch "
           f"{args.micro_batch}, k={args.k}: the window's last micro-batch")
  rows = bench.Rows(
      title + f"; medians over {args.windows - 1} traced windows, ms from "
      "the step's first op, worker 0", args.json, markdown=True,
      formats=dict.fromkeys(("backward ends", "first pack starts",
                             "last pack ends", "step", "packs"), ".0f"))
  traces, steps = {}, {}
  try:
    with tempfile.TemporaryDirectory(prefix="overlap_") as directory:
      for mode in MODES:
        traced = _launch(args, prefix, mode, directory)
        marks = [timings(ops) for ops in traced]
        median = {key: statistics.median(m[key] for m in marks)
                  for key in marks[0]}
        steps[mode] = median["step"]
        traces[mode] = traced[-1]
        rows.add(**{"mode": mode, "backward ends": median["backward ends"],
                    "first pack starts": median["first pack"],
                    "last pack ends": median["last pack ends"],
                    "step": median["step"], "packs": median["packs"]})
  finally:
    if bed is not None:
      bed.down()
  print(f"last micro-batch: no_overlap / overlap = "
        f"{steps['no_overlap'] / steps['overlap']:.2f}x")
  if args.figure:
    figure(traces, args.figure, title)
    print(f"timeline: {args.figure}")
  if args.chrome_trace:
    os.makedirs(args.chrome_trace, exist_ok=True)
    for mode, ops in traces.items():
      chrome_trace(ops, os.path.join(args.chrome_trace, f"{mode}.json"))
    print(f"chrome traces: {args.chrome_trace}")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
