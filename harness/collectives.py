"""A SessionRunHook that counts the collective ops each step runs.

Traces every run (RunOptions FULL_TRACE) and records, per step, the number
of collective kernels (all-reduce, all-gather, broadcast) executed on this
task and the bytes they produced, and the step's wall time. Used by the MultiWorkerMirroredStrategy
comparison in benchmarks/public_recipe.py and by the tests.
"""

import json
import sys
import time

import tensorflow as tf

_COLLECTIVE_OPS = ("CollectiveReduce", "CollectiveGather", "CollectiveBcast",
                   "CollectiveAllToAll", "NcclAllReduce")


class CollectiveCounter(tf.compat.v1.train.SessionRunHook):
  """Collects [(collective ops, bytes reduced, seconds)] per step.

  Estimator deep-copies its params, hooks passed through them included: give
  output_path, and the copy that ran writes its steps there as JSON at the
  end.
  """

  def __init__(self, output_path=None):
    self.steps = []
    self._output_path = output_path
    self._start = None

  def before_run(self, run_context):
    del run_context
    self._start = time.perf_counter()
    return tf.compat.v1.train.SessionRunArgs(
        None, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    del run_context
    seconds = time.perf_counter() - self._start
    count, size = 0, 0
    for device in run_values.run_metadata.step_stats.dev_stats:
      for node in device.node_stats:
        # "name = OpType(inputs)": the kernel's type, so that the constants
        # a collective is given (its group and instance keys) do not count.
        op = node.timeline_label.split("(")[0].split(" = ")[-1].strip()
        if op.startswith(_COLLECTIVE_OPS):
          count += 1
          size += sum(output.tensor_description.allocation_description
                      .requested_bytes for output in node.output)
    self.steps.append((count, size, seconds))

  def end(self, session):
    del session
    if self._output_path:
      with open(self._output_path, "w") as writer:
        json.dump(self.steps, writer)


def collectives_before_input(graph):
  """The names of the collective ops the graph's train op runs that do not
  wait for the step's input (no IteratorGetNext among what they depend on,
  through data or control inputs). When the input ends, a worker's step
  fails at its IteratorGetNext: a collective that started anyway waits for
  the other workers' part of a step they may have ended already."""
  train_ops = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
  runs, stack = set(), [op for t in train_ops for op in [getattr(t, "op", t)]]
  while stack:
    op = stack.pop()
    if op in runs:
      continue
    runs.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  waits = {}

  def waits_for_input(op):
    if op not in waits:
      waits[op] = False  # (no cycles in a graph; a guard all the same)
      waits[op] = op.type.startswith("IteratorGetNext") or any(
          waits_for_input(o) for o in
          [t.op for t in op.inputs] + list(op.control_inputs))
    return waits[op]

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))
  return sorted(op.name for op in runs
                if op.type.startswith(_COLLECTIVE_OPS)
                and not waits_for_input(op))


class CollectivesBeforeInput(tf.compat.v1.train.SessionRunHook):
  """Writes `collectives_before_input` of the train graph to `output_path`
  (JSON) when the session is made."""

  def __init__(self, output_path):
    self._output_path = output_path

  def after_create_session(self, session, coord):
    del coord
    with open(self._output_path, "w") as writer:
      json.dump(collectives_before_input(session.graph), writer)
