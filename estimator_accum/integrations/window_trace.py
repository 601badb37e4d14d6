"""`WindowTraceHook`: where one window's time goes, from TensorFlow's own
trace of its micro-batches.

Add it to the training hooks of a model_fn (or of `train(hooks=...)`) that
called `build_accumulating_train_op`. After `skip_windows` whole windows
(the first runs pay one-time costs: the executor's build, XLA's compiles),
it traces the k micro-batches of the next window, the last of them its
end (`RunOptions.FULL_TRACE`), writes them as a Chrome trace (for
chrome://tracing or Perfetto) and logs where the window's time went:

  window trace: the window before, untraced: 4 micro-batches in 281 ms;
      traced: 405 ms, ops busy 295 ms (435 ms of op time over the
      threads): matmuls 61%, element-wise 16%, ...; outside the ops
      101 ms (session call, hooks, waits, tracing)

Tracing slows the traced steps (each op's times are recorded): the
untraced window before is the window's time; the shares are the trace's.
"""

import collections
import json
import os
import re
import time

import tensorflow as tf

from estimator_accum import _files
from estimator_accum.window import progress
from estimator_accum.window.train_op import get_accumulation_state

__all__ = ["CATEGORIES", "WindowTraceHook", "category_of", "summarize"]

# Op type -> category: the first pattern the op type matches (re.search).
CATEGORIES = (
    # (--fused_apply's compiled end is a function call of its own.)
    ("the window's end (compiled)", r"Xla|PartitionedCall"),
    ("matmuls", r"MatMul|Einsum|Conv"),
    ("gathers and scatters", r"Gather|Scatter|Segment|Where|Dynamic"
                             r"(Partition|Stitch)|TensorScatter"),
    ("softmax", r"Softmax"),
    ("reductions (layer norm, loss)", r"^(Mean|Sum|Max|Min|Prod|All|Any|"
                                      r"ArgMax|L2Loss|_Mkl.*Mean)"),
    ("variables (reads, accumulator adds, apply)",
     r"Variable|Assign|ResourceApply|ApplyAdam|ResourceScatter"),
    ("input (tf.data)", r"Iterator|Dataset|OptionalGetValue"),
    ("random numbers (dropout)", r"Random"),
    ("shapes, copies, control flow",
     r"^(Identity|IdentityN|Const|NoOp|Reshape|Shape|ShapeN|Size|Rank|"
     r"Concat|ConcatV2|Slice|StridedSlice|StridedSliceGrad|Pack|Unpack|"
     r"Transpose|_Mkl.*Transpose|Switch|Merge|Enter|Exit|NextIteration|"
     r"LoopCond|If|StatelessIf|While|StatelessWhile|ExpandDims|Squeeze|Fill|ZerosLike|OnesLike|"
     r"Tile|BroadcastTo|BroadcastArgs|BroadcastGradientArgs|Range|Pad|"
     r"_Retval|_Arg|_Recv|_Send|_HostRecv|_HostSend|Cast)$"),
    ("element-wise", r"."),
)

_OP_TYPE = re.compile(r"=\s*([A-Za-z0-9_]+)\(")


def category_of(op_type):
  """The CATEGORIES name of `op_type` (a TensorFlow op type)."""
  for name, pattern in CATEGORIES:
    if re.search(pattern, op_type):
      return name
  return CATEGORIES[-1][0]


def _op_type(node):
  found = _OP_TYPE.search(node.timeline_label or "")
  if found:
    return found.group(1)
  return node.node_name.split(":")[0].rsplit("/", 1)[-1] or "?"


def summarize(steps):
  """Where the traced steps' time went.

  Args:
    steps: [(RunMetadata.step_stats, wall seconds)], one per traced
      session.run.

  Returns:
    A dict: "wall_ms" (the steps' session.run times), "busy_ms" (time any
    op ran: the union of the ops' intervals), "thread_ms" (the ops'
    durations summed over threads), "categories" ({name:
    thread-ms}, largest first) and "ops" ({op type: thread-ms}).
  """
  categories = collections.Counter()
  ops = collections.Counter()
  wall = busy = thread_ms = 0.0
  for step_stats, seconds in steps:
    wall += seconds * 1e3
    intervals = []
    for device in step_stats.dev_stats:
      for node in device.node_stats:
        op_type = _op_type(node)
        if op_type in ("_SOURCE", "SOURCE"):
          continue
        duration = node.all_end_rel_micros / 1e3
        start = node.all_start_micros / 1e3
        categories[category_of(op_type)] += duration
        ops[op_type] += duration
        thread_ms += duration
        intervals.append((start, start + duration))
    busy += _union(intervals)
  return {"wall_ms": wall, "busy_ms": busy, "thread_ms": thread_ms,
          "categories": dict(categories.most_common()),
          "ops": dict(ops.most_common())}


def _union(intervals):
  total, end = 0.0, None
  for start, stop in sorted(intervals):
    if end is None or start > end:
      total += stop - start
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total


def describe(summary, k, untraced_ms=None):
  """The hook's line for `summary` (summarize's) of a window of k, and the
  untraced window's wall time before it."""
  thread_ms = summary["thread_ms"] or 1.0
  shares = ", ".join(f"{name} {100 * ms / thread_ms:.0f}%"
                     for name, ms in summary["categories"].items()
                     if ms / thread_ms >= 0.005)
  outside = max(summary["wall_ms"] - summary["busy_ms"], 0.0)
  before = ("" if untraced_ms is None else
            f"the window before, untraced: {k} micro-batches in "
            f"{untraced_ms:.0f} ms; ")
  return (f"window trace: {before}traced: {summary['wall_ms']:.0f} ms, ops "
          f"busy {summary['busy_ms']:.0f} ms ({thread_ms:.0f} ms of op time "
          f"over the threads): {shares}; outside the ops {outside:.0f} ms "
          f"(session call, hooks, waits, tracing)")


def chrome_trace(steps):
  """The traced steps as a Chrome trace (a JSON-able dict), one after the
  other on a time axis of their own."""
  events, offset = [], 0.0
  for index, (step_stats, _) in enumerate(steps):
    starts = [node.all_start_micros for device in step_stats.dev_stats
              for node in device.node_stats]
    first = min(starts) if starts else 0
    last = first
    for device in step_stats.dev_stats:
      for node in device.node_stats:
        op_type = _op_type(node)
        events.append({
            "name": op_type, "cat": category_of(op_type), "ph": "X",
            "ts": offset + node.all_start_micros - first,
            "dur": max(node.all_end_rel_micros, 1), "pid": index,
            "tid": node.thread_id, "args": {"node": node.node_name}})
        last = max(last, node.all_start_micros + node.all_end_rel_micros)
    offset += last - first + 1000
  return {"traceEvents": events, "displayTimeUnit": "ms"}


class WindowTraceHook(tf.compat.v1.train.SessionRunHook):
  """Traces one window's micro-batches and says where its time went."""

  def __init__(self, output_dir, skip_windows=3):
    """Creates the hook.

    Args:
      output_dir: directory for `window_trace.json` (a Chrome trace).
      skip_windows: int >= 0, whole windows run before the traced one.

    Raises:
      ValueError: a bad argument, named.
    """
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
      raise ValueError(f"output_dir must be a directory path, got "
                       f"{output_dir!r}.")
    if (isinstance(skip_windows, bool) or not isinstance(skip_windows, int)
        or skip_windows < 0):
      raise ValueError(f"skip_windows must be an int >= 0, got "
                       f"{skip_windows!r}.")
    self._output_dir = str(output_dir)
    self._skip = skip_windows
    self._state = None
    self._step = None
    self._first = None
    self._steps = []
    self._untraced = []
    self._started = None
    self.summary = None
    self.path = None

  def begin(self):
    self._state = get_accumulation_state()

  def after_create_session(self, session, coord):
    del coord
    self._step = int(session.run(self._state.global_step))
    k = self._state.k
    # The first micro-batch of a window, after skip_windows whole ones
    # (at least one: the window before is timed untraced).
    self._first = (self._step + k - 1) // k * k + max(self._skip, 1) * k

  def _tracing(self):
    return (self.summary is None and
            self._first <= self._step < self._first + self._state.k)

  def before_run(self, run_context):
    del run_context
    self._started = time.perf_counter()
    if not self._tracing():
      return None
    return tf.compat.v1.train.SessionRunArgs(
        fetches=None, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    del run_context
    seconds = time.perf_counter() - self._started
    if self._first - self._state.k <= self._step < self._first:
      self._untraced.append(seconds)
    if self._tracing():
      self._steps.append((run_values.run_metadata.step_stats, seconds))
      if len(self._steps) == self._state.k:  # the window's end
        self._finish()
    self._step += 1

  def _finish(self):
    self.summary = summarize(self._steps)
    tf.io.gfile.makedirs(self._output_dir)
    self.path = os.path.join(self._output_dir, "window_trace.json")
    _files.write_whole(self.path, json.dumps(chrome_trace(self._steps)))
    untraced = (1e3 * sum(self._untraced)
                if len(self._untraced) == self._state.k else None)
    progress.log_info(describe(self.summary, self._state.k, untraced) +
                      f" (Chrome trace: {self.path})")
    self._steps = []
