"""The progress line, and the logging that shows it where Estimator's own
lines show.

`build_accumulating_train_op` logs, with no hook added, the first
micro-batch, the end of the first window, and then every
`log_every_n_micro_batches`:

  micro-batch 400 | update 100 (k=4) | skipped windows 0 |
      25.4 micro-batches/sec | 812.3 examples/sec

The graph decides when (a `tf.cond`, true on those micro-batches only) and a
Python function run by the graph writes the line, so it needs no hook and
costs nothing on the other micro-batches. `AccumulationLoggingHook` logs a
fuller line (progress against max_steps, loss, time left) and silences this
one. The function exists only in the process that built the graph: a graph
imported elsewhere (`import_meta_graph`) fails the first step a line is due
unless it was built with `log_every_n_micro_batches=None`.
"""

import logging as std_logging
import math
import time

import numpy as np
import tensorflow as tf
from absl import logging

from estimator_accum import graph_state
from estimator_accum.distribution import replicas


def log_info(message, *args):
  """Logs at INFO through absl logging, or through TensorFlow's logger when
  only that one shows INFO: a script that calls
  `tf.compat.v1.logging.set_verbosity(INFO)` without absl's `app.run` sees
  Estimator's lines and not absl's. Either way the line shows where
  Estimator's own do, and once."""
  if (not logging.get_absl_logger().isEnabledFor(std_logging.INFO) and
      tf.get_logger().isEnabledFor(std_logging.INFO)):
    tf.get_logger().info(message, *args)
  else:
    logging.info(message, *args)


# absl names the caller of log_info (hooks.py, train_op.py) in its lines.
logging.ABSLLogger.register_frame_to_skip(__file__, "log_info")


def rate_text(value):
  """A rate with one decimal, and more below 10/sec so that it keeps three
  significant digits (a BERT-Base micro-batch on a CPU is 0.312/sec, not
  0.3)."""
  decimals = 1
  if 0 < value < 10:
    decimals = min(2 - math.floor(math.log10(value)), 6)
  return f"{value:.{decimals}f}"


class ProgressLine:
  """Writes the progress line of one graph's accumulating train op.

  Holds no reference to the graph (the graph holds the function the line is
  written by, and must stay collectable).
  """

  def __init__(self, k, every_n, num_replicas):
    self._k = k
    self._every_n = every_n
    self._num_replicas = num_replicas
    self._last = None  # (micro-batch, time) of the previous line
    self.silenced = False

  def op(self, step, updates, skipped, examples, local_replicas):
    """The op that writes the line when micro-batch `step` (1-based) is the
    first, ends the first window (the line that has rates first: the first
    only starts the clock), or is a multiple of `every_n`.

    Args:
      step: int64 scalar tensor, micro-batches run, this one included.
      updates: int64 scalar tensor, updates applied.
      skipped: int64 scalar tensor, windows skipped.
      examples: int64 scalar tensor, this micro-batch's examples over the
        worker's replicas, or -1 when they cannot be told.
      local_replicas: int, the worker's replicas (examples/sec counts every
        replica in sync, as many on every worker).
    """
    due = tf.reduce_any([
        tf.equal(step, 1), tf.equal(step, max(self._k, 2)),
        tf.equal(tf.math.floormod(step, self._every_n), 0)])

    def write():
      return tf.numpy_function(
          lambda *values: self._write(*values, local_replicas),
          [step, updates, skipped, examples], tf.int64, stateful=True,
          name="progress_line")

    return tf.cond(due, write, lambda: tf.constant(0, tf.int64),
                   name="progress")

  def _write(self, step, updates, skipped, examples, local_replicas):
    now = time.monotonic()
    step = int(step)
    line = (f"micro-batch {step} | update {int(updates)} (k={self._k}) | "
            f"skipped windows {int(skipped)}")
    if self._last is not None and step > self._last[0]:
      rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
      line += f" | {rate_text(rate)} micro-batches/sec"
      if examples >= 0:
        # This worker's replicas' examples; as many on every other worker.
        per_second = rate * int(examples) * self._num_replicas / local_replicas
        line += f" | {rate_text(per_second)} examples/sec"
    self._last = (step, now)
    if not self.silenced:
      log_info(line)
    return np.int64(step)


def progress_line(name, k, every_n):
  """The graph's ProgressLine if the train op `name` is the graph's first
  (every replica of it gets the same one), else None. None too when
  `every_n` is None."""
  if every_n is None:
    return None
  lines = graph_state.owned("progress", dict)
  owner, line = lines.setdefault(
      "first", (name, ProgressLine(k, every_n, replicas.num_replicas())))
  return line if owner == name else None


def silence(graph):
  """Stops the progress line of `graph` (a hook logs its own)."""
  first = graph_state.owned("progress", dict, graph).get("first")
  if first is not None:
    first[1].silenced = True
