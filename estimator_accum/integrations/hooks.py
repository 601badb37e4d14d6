"""`AccumulationLoggingHook`: a progress line for accumulating Estimator runs.

Every `every_n_micro_batches` it logs one line (`progress.log_info`: absl
logging, or TensorFlow's logger where only that one shows INFO):

  micro-batch 400 | update 100 (k=4) | skipped windows 0 |
      25.4 micro-batches/sec | 812.3 examples/sec

a warning whenever a window has been skipped for a non-finite gradient
since the previous line, and once, after the first windows, what a window
costs and what a larger k would save (`planning.window_cost`):

  window cost: <k> micro-batches of <t> s, and its end <e> s more
      (all-reduce and apply: <share> of the window's <k t + e> s);
      k=<2k> would spend <share> there (<ratio>x the examples/sec), ...
"""

import time

import tensorflow as tf
from absl import logging

from estimator_accum.distribution import replicas
from estimator_accum.planning import window_cost
from estimator_accum.window import progress
from estimator_accum.window.train_op import get_accumulation_state

# Windows timed (after a warm-up one) for the window cost line.
COST_WINDOWS = 3


def _check_count(name, value):
  """The hooks' step counts: a ValueError naming `name` unless an int >= 1."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}.")


class AccumulationLoggingHook(tf.compat.v1.train.SessionRunHook):
  """Logs micro-batch, update count and throughput while training.

  Add it to `EstimatorSpec(training_hooks=[...])` in the model_fn that called
  `build_accumulating_train_op`.
  """

  def __init__(self, every_n_micro_batches=100, micro_batch_size=None,
               total_micro_batches=None, loss=None, work=None):
    """Creates the hook.

    Args:
      every_n_micro_batches: int >= 1, micro-batches between two log lines.
      micro_batch_size: optional int, examples per micro-batch on each
        replica, for the line's examples/sec over all replicas. By default
        the examples are counted as they run: the train op's `num_examples`
        when it was given one, else the leading dimension of the batch its
        loss is computed from (Estimator's input_fn); the line has no
        examples/sec when neither can be told (a loss fed by placeholders).
      total_micro_batches: optional int, the micro-batches training will run
        (Estimator's max_steps); when given, the line shows progress and the
        time left.
      loss: optional scalar tensor, the micro-batch loss, shown on the line.
      work: optional scalar tensor, what a micro-batch computes when that
        varies (its token positions: batch x length, for inputs trimmed or
        sorted by length). The window cost line then compares the step
        that ends a window with a step of the same work, not with the
        median step: a window sorted by length ends on its longest
        micro-batch.

    Raises:
      ValueError: if an argument is not a positive int.
    """
    _check_count("every_n_micro_batches", every_n_micro_batches)
    for name, value in (("micro_batch_size", micro_batch_size),
                        ("total_micro_batches", total_micro_batches)):
      if value is not None:
        _check_count(name, value)
    self._every_n = every_n_micro_batches
    self._micro_batch_size = micro_batch_size
    self._total = total_micro_batches
    self._loss = loss
    self._work = work
    self._step_work = []
    self._state = None
    self._fetches = None
    self._last_time = None
    self._last_step = None
    self._last_skipped = None
    self._step = None
    self._num_replicas = 1
    self._examples = None
    self._examples_counted = 0
    # Step times of the first windows, for the window cost line.
    self._step_seconds = []
    self._first_position = None
    self._step_started = None

  def begin(self):
    self._state = get_accumulation_state()
    # This line replaces the one the train op logs by itself.
    progress.silence(tf.compat.v1.get_default_graph())
    self._fetches = {
        "step": self._state.global_step,
        "updates": self._state.updates_applied,
        "skipped": self._state.skipped_windows,
    }
    self._num_replicas = replicas.num_replicas()
    examples = list((self._state.examples or {}).values())
    if self._micro_batch_size is not None:
      return
    if examples and all(e is not None for e in examples):
      self._examples = examples
    else:
      progress.log_info(
          "AccumulationLoggingHook: the micro-batch's examples cannot be "
          "counted (the loss does not come from one input_fn batch); pass "
          "micro_batch_size= to the hook or num_examples= to "
          "build_accumulating_train_op for examples/sec.")

  def after_create_session(self, session, coord):
    del coord
    values = session.run(self._fetches)
    self._last_step = self._step = values["step"]
    self._last_skipped = values["skipped"]
    self._last_time = time.time()

  def before_run(self, run_context):
    del run_context
    self._step_started = time.perf_counter()
    fetches = {}
    if self._examples is not None:
      fetches["examples"] = self._examples
    if self._work is not None:
      # Every step, not only the first windows': one set of fetches, one
      # executor (each new set is a new optimization of the graph).
      fetches["work"] = self._work
    if self._loss is not None:
      # Every step too: a fetch set first seen on a log step built a new
      # executor there (about 1.5 s for BERT; a scalar costs nothing).
      fetches["loss"] = self._loss
    return tf.compat.v1.train.SessionRunArgs(fetches) if fetches else None

  def after_run(self, run_context, run_values):
    results = run_values.results or {}
    self._time_window(time.perf_counter() - self._step_started,
                      results.get("work"))
    self._step += 1
    if "examples" in results:
      self._examples_counted += sum(int(e) for e in results["examples"])
    if self._step - self._last_step < self._every_n:
      return
    # Read after the micro-batch has finished: a fetch in before_run would
    # race with the train op's own updates of these counters.
    values = run_context.session.run(self._fetches)
    step = values["step"]
    now = time.time()
    rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
    done = f"micro-batch {step}"
    if self._total is not None:
      done += f"/{self._total} ({100 * step / self._total:.0f}%)"
    line = (f"{done} | update {values['updates']} "
            f"(k={self._state.k}) | skipped windows {values['skipped']} | "
            f"{progress.rate_text(rate)} micro-batches/sec")
    examples = None
    if self._micro_batch_size is not None:
      examples = rate * self._micro_batch_size * self._num_replicas
    elif self._examples is not None:
      # This worker's replicas' examples; as many on every other worker.
      examples = (self._examples_counted * self._num_replicas /
                  len(self._examples) / max(now - self._last_time, 1e-9))
    if examples is not None:
      line += f" | {progress.rate_text(examples)} examples/sec"
    if "loss" in results:
      line += f" | loss {results['loss']:.4f}"
    if self._total is not None and rate > 0:
      left = max(self._total - step, 0) / rate
      line += f" | {int(left // 60)}m{int(left % 60):02d}s left"
    progress.log_info(line)
    if values["skipped"] > self._last_skipped:
      logging.warning(
          "%d window(s) skipped for non-finite gradients since micro-batch %d",
          values["skipped"] - self._last_skipped, self._last_step)
    self._last_step, self._last_time = step, now
    self._examples_counted = 0
    self._last_skipped = values["skipped"]

  def _time_window(self, seconds, work):
    """Keeps the first windows' step times (and works); logs their cost
    once."""
    if self._step_seconds is None:
      return
    if self._first_position is None:
      self._first_position = self._step
    self._step_seconds.append(seconds)
    self._step_work.append(work)
    k = self._state.k
    if len(self._step_seconds) < COST_WINDOWS * k + k:
      return
    works = self._step_work if None not in self._step_work else None
    cost = window_cost.measure(self._step_seconds, k, self._first_position,
                               work=works)
    self._step_seconds = None
    if cost is not None:
      progress.log_info(cost.describe())



class EveryStepSummaryHook(tf.compat.v1.train.SessionRunHook):
  """TensorBoard summaries with one set of fetches on every step.

  Estimator's SummarySaverHook fetches the merged summaries on its save
  steps only (and its LoggingTensorHook the loss on its log steps). Each
  new set of fetches is a new executor: TensorFlow prunes and optimizes the
  whole graph again (Grappler, about 1.7-2.4 s for the main job's BERT),
  the first time each set runs. This hook fetches the merged summaries on
  every step (a few scalars: nothing one can measure) and writes them every
  `save_steps` steps and on the first, so every step runs one executor.

  Give the Estimator `save_summary_steps=None` (RunConfig; else its own
  hook fetches them too) and, for one executor, `log_step_count_steps=None`.
  One process: on a cluster each task would write its own events.
  """

  def __init__(self, output_dir, save_steps=100):
    _check_count("save_steps", save_steps)
    if not output_dir:
      raise ValueError(f"output_dir must be a directory, got {output_dir!r}.")
    self._output_dir = output_dir
    self._save_steps = save_steps
    self._summary = None
    self._global_step = None
    self._next_step = None
    self._step_read, self._runs = 0, 0
    self._writer = None

  def begin(self):
    self._summary = tf.compat.v1.summary.merge_all()
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._global_step is None:
      raise RuntimeError("EveryStepSummaryHook needs a global step.")
    self._writer = (None if self._summary is None else
                    tf.compat.v1.summary.FileWriterCache.get(
                        self._output_dir))

  def before_run(self, run_context):
    del run_context
    if self._summary is None:
      return None
    return tf.compat.v1.train.SessionRunArgs(self._summary)

  def after_run(self, run_context, run_values):
    if self._summary is None:
      return
    self._runs += 1
    if self._next_step is not None and (
        self._step_read + self._runs < self._next_step):
      # Not due, counting at most one step a run (the step is read apart,
      # and only when a save may be due: a read is a session call).
      return
    # Read apart, as SummarySaverHook does: a fetch beside the train op
    # may read the step before or after its increment.
    step = int(run_context.session.run(self._global_step))
    self._step_read, self._runs = step, 0
    if self._next_step is None or step >= self._next_step:
      self._writer.add_summary(run_values.results, step)
      self._next_step = (step // self._save_steps + 1) * self._save_steps

  def end(self, session):
    del session
    if self._writer is not None:
      self._writer.flush()
