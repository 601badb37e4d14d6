"""`build_accumulating_train_op`: k micro-batches that train as one big batch.

Each run of the returned op is one micro-batch, counted by `global_step`:

1. the micro-batch gradient is added to per-variable float32 accumulators
   (`<var>/accum`), on its own replica, with no communication;
2. if it is the k-th micro-batch of the window (`(global_step + 1) % k == 0`),
   the window's gradient is formed (mean over the window and the replicas,
   weighted by `num_examples` if given), all-reduced once, checked for
   NaN/Inf, clipped by global norm, handed to the optimizer, and the
   accumulators are zeroed; a non-finite window is skipped whole (no update,
   accumulators zeroed, `skipped_windows` incremented, a warning logged);
3. `global_step` is incremented by one, after all of the above.

On the other k-1 micro-batches the optimizer is not called at all, so no
weight and no slot (momentum, Adam moments, beta powers) moves.

The window in progress is saved in checkpoints. A run resumed from one with
another k or another number of replicas ends that window at its next
multiple of k, as the mean of the micro-batches it holds; later windows are
k micro-batches again.

The end-of-window decision is taken in cross-replica context (a `merge_call`
around the `tf.cond`), and the optimizer runs from there through
`call_for_each_replica`. That is what lets the optimizer's own `merge_call`
work under MirroredStrategy and MultiWorkerMirroredStrategy with control flow
v2, where calling it inside a `tf.cond` built in replica context fails. With no
strategy the same code runs under TensorFlow's default strategy, whose
`merge_call` and `call_for_each_replica` are plain function calls.
"""

import tensorflow as tf

from estimator_accum import _checks, graph_state
from estimator_accum._autograph import as_written
from estimator_accum.checkpoints.state_variables import (
  StateVariables,
  name_window_state,
  variable_base_name,
)
from estimator_accum.distribution import preemption, replicas, watchdog
from estimator_accum.distribution.placement import between_graph_worker_device
from estimator_accum.options import (
  DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS,
  DEFAULT_NAME,
  WindowSettings,
  window_options,
)
from estimator_accum.window import loss_scale as _loss_scale
from estimator_accum.window import (
  micro_batch,
  progress,
  reductions,
  trained_checks,
  window_copies,
)
from estimator_accum.window import reports as window_reports
from estimator_accum.window.batch_norm import close_window_statistics
from estimator_accum.window.compact import SPARSE_THRESHOLD_BYTES
from estimator_accum.window.plan import make_plan
from estimator_accum.window.state import AccumulationState
from estimator_accum.window.step_counting import check_optimizer_steps
from estimator_accum.window.window import Window

__all__ = ["AccumulationState", "build_accumulating_train_op",
           "get_accumulation_state"]


@as_written
def build_accumulating_train_op(
    loss, optimizer, k, *, global_step=None, var_list=None,
    num_examples=None, colocate_gradients_with_ops=False,
    clip_norm=None, reduction="mean", accumulator_dtype=tf.float32,
    accumulator_placement="device", summaries=True, loss_scale=None,
    sparse_accumulation="auto", sparse_threshold_bytes=SPARSE_THRESHOLD_BYTES,
    communication_options=None, table_all_reduce="auto",
    communication_dtype=None, overlap_backward=True, sequential_apply=True,
    fused_apply=False, after_update=None, log_every_n_micro_batches=100,
    max_consecutive_skipped_windows=DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS,
    name=DEFAULT_NAME):
  """Returns a train op that applies one update every `k` micro-batches.

  Call it in place of `optimizer.minimize(loss, global_step)`. The contract:

  - Window: the k-th micro-batch of a window (`(global_step + 1) % k ==
    0`, on each replica) applies one update; the other k-1 call no
    optimizer: no weight, slot or optimizer counter moves.
  - Scaling: the update's gradient is the mean over the window's
    micro-batches and every replica and worker, all-reduced once per window
    (weighted by `num_examples` if given; the sum with `reduction="sum"`).
    Do not divide the loss by k or by the number of replicas.
  - Counting: `global_step` counts micro-batches (so do Estimator's
    `max_steps`), one after each micro-batch's work; schedules that count
    updates use `update_count(k)` (one computed from `global_step` is
    warned about; an AdagradDAOptimizer given it is refused).
  - Clipping: `clip_norm` clips the window's mean, as the big batch's.
  - Non-finite windows are skipped whole (no update, accumulators zeroed,
    `skipped_windows` + 1, a warning); `max_consecutive_skipped_windows` in
    a row stop the run ("training diverged").
  - Resume: the open window is saved in checkpoints and restored exactly
    (with another k or number of replicas it ends at its next multiple of
    k, as the mean of what it holds). A step that finds its input ended
    adds nothing; a window the input ends in stays in the checkpoint.
  - Refused in one line naming the argument: eager execution or a
    tf.function, cross-replica context, a second train op on the same
    counter, ProximalAdagrad under a strategy, compact sparse accumulation
    over several replicas; a TypeError for an argument of the wrong type, a
    ValueError for a bad value (k < 1, a loss or global_step not a scalar,
    no gradient, AdagradDA counting global_step, conflicting arguments).

  Args:
    loss: scalar floating-point tf.Tensor, the loss of one micro-batch,
      averaged over its examples (or summed, with `reduction="sum"`).
    optimizer: a `tf.compat.v1.train.Optimizer` (any subclass, including
      BERT's AdamWeightDecay) or a `tf.keras.optimizers.legacy.Optimizer`.
    k: int >= 1, micro-batches per update.
    global_step: int64 scalar variable counting micro-batches; default
      `tf.compat.v1.train.get_or_create_global_step()`.
    var_list: the tf.Variables to train; default all trainable variables.
    num_examples: optional scalar tensor, this micro-batch's examples: its
      gradient is weighted by them (a short micro-batch's window is exact).
    colocate_gradients_with_ops: bool, passed to `tf.gradients`.
    clip_norm, reduction, accumulator_dtype, accumulator_placement,
      summaries, loss_scale, sparse_accumulation, sparse_threshold_bytes,
      communication_options, table_all_reduce, communication_dtype,
      overlap_backward, sequential_apply, fused_apply, after_update,
      log_every_n_micro_batches, max_consecutive_skipped_windows, name:
      the window options, documented in `estimator_accum.options.OPTIONS`.

  Returns a tf.Operation: run it once per micro-batch.
  """
  settings = WindowSettings.checked(
      k, **window_options(locals()), gradient_options=dict(
          colocate_gradients_with_ops=colocate_gradients_with_ops))
  _checks.check_graph_mode()
  batch = micro_batch.of_loss(loss, var_list, num_examples)
  train_op, _ = accumulating_train_op(batch, optimizer, settings,
                                      global_step=global_step)
  return train_op


def accumulating_train_op(batch, optimizer, settings, *, global_step):
  """The one builder every front door calls: the train op of the
  `micro_batch.MicroBatch` `batch` (checked where it was given), with
  `optimizer` and the checked `WindowSettings`. Returns (the train op, its
  `Window`)."""
  optimizer, loss_scale_config, global_step, reduction = _check_inputs(
      batch, optimizer, settings, global_step)
  outer_scope = tf.compat.v1.get_default_graph().get_name_scope()
  train_ops_before = list(tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.TRAIN_OP))
  with tf.compat.v1.name_scope(settings.name):
    scaler = None
    if loss_scale_config is not None:
      # Shared by every worker: made as counters are (StateVariables()).
      scaler = _loss_scale.LossScaler(loss_scale_config, settings.name,
                                      StateVariables(),
                                      unscales=batch.loss is not None)
    with window_copies.gradients_of(settings.name):
      trained = batch.gradients(scaler, dict(settings.gradient_options))
    trained_checks.check_ref_variables(trained, optimizer)
    name_window_state(trained)
    trained_checks.check_distinct_names(trained)
    # Told to stop (SIGTERM): every replica and worker agrees on one
    # micro-batch, which then changes nothing, and Estimator saves.
    trained, stop_agreed = preemption.gate(batch.loss, trained, global_step,
                                           replicas.sum_flags)
    plan = make_plan(settings, trained, reduction,
                     between_graph_worker_device(batch.source, global_step),
                     outer_scope)
    window = Window(
        plan, trained, optimizer, global_step, loss_scaler=scaler,
        progress=progress.progress_line(
            settings.name, settings.k, settings.log_every_n_micro_batches))
    examples = window_reports.micro_batch_examples(batch.source,
                                                   batch.num_examples)
    # A loss reportable_loss was given first needs no NaN line of its own:
    # Estimator trains on, and the window's end says it skipped.
    loss = batch.loss
    accumulated = window.accumulate_micro_batch(
        None if loss is None or window_reports.is_reported(loss) else loss)
    train_op = preemption.join(replicas.merge(
        window.end_micro_batch, accumulated,
        *((examples,) if examples is not None else ())), stop_agreed)
  # In a multi-task cluster: a lost peer ends this task in bounded time.
  train_op = watchdog.arm(train_op)
  _replace_train_ops(train_ops_before, train_op)
  _record_state(window, examples)
  return train_op, window


def _check_inputs(batch, optimizer, settings, global_step):
  """Checks what the graph gives besides the micro-batch: the graph, the
  optimizer, the counter and the replica context. Returns (the optimizer
  unwrapped, its loss-scale config or None, global_step, the window's
  `reductions.Reduction`), the counter claimed for this train op. (The
  front door checked the graph before it made the micro-batch.)"""
  optimizer, loss_scale_config = _loss_scale.unwrap_optimizer(
      optimizer, settings.loss_scale, batch.source)
  _checks.check_optimizer(optimizer)
  if (batch.loss is None and loss_scale_config is not None and
      not batch.scaled_by_caller):
    raise ValueError(
        "loss_scale needs the loss, to scale it before the gradients are "
        "taken; apply_gradients is given gradients already taken. Call "
        "AccumulatingOptimizer.minimize(loss, ...) instead, or pass "
        "loss_scale=None and an optimizer that is not a loss-scale wrapper.")
  _checks.warn_bypassed_compute_gradients(optimizer)
  _checks.check_global_step(global_step)
  reduction = reductions.for_options(settings.reduction, batch.num_examples)
  if reduction.averages_mean_losses:
    _checks.warn_of_summed_loss(settings.reduction)
  if not replicas.in_replica_context():
    raise RuntimeError(
        "build_accumulating_train_op must be called in replica context (a "
        "model_fn, or a function run by strategy.run), not in cross-replica "
        "context such as directly under strategy.scope().")
  _checks.check_optimizer_under_strategy(optimizer)
  if global_step is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
    _checks.check_global_step(global_step)
  check_optimizer_steps(optimizer, global_step, settings.k)
  _claim_counter(global_step, settings.name)
  return optimizer, loss_scale_config, global_step, reduction


class _TrainOps:
  """What this module keeps per graph: the AccumulationState of the graph's
  first train op, and {counter variable name: the train op counting it}."""

  def __init__(self):
    self.state = None
    self.counters = {}


def _train_ops(graph=None):
  return graph_state.owned("accumulation", _TrainOps, graph)


def _record_state(window, examples):
  """Keeps the graph's AccumulationState (of its first train op) and this
  replica's micro-batch size, for hooks and the progress line."""
  # The window is the mean over replicas, as optimizer.minimize's is.
  replicas.mark_loss_mean_over_replicas()
  # Under MirroredStrategy every replica builds the same state; keep the first.
  graph = _train_ops()
  if graph.state is None:
    _log_state_size(window.state)
    graph.state = window.state._replace(examples={})
    close_window_statistics()
  # Every replica's micro-batch size, for the progress line's examples/sec;
  # of the first train op, as the state is (a second one, in a GAN, runs on
  # the same batches).
  graph.state.examples.setdefault(replicas.replica_id(), examples)


def _replace_train_ops(before, train_op):
  """Puts `train_op` in the graph's TRAIN_OP collection in place of the
  optimizer's apply ops added there while the window was built.

  A tf.compat.v1 optimizer adds its apply op to TRAIN_OP, as `minimize` does.
  Built inside the window's tf.cond, that op runs only as part of the
  branch; under control flow v2 it is not even in this graph but in the
  branch's function, and a meta graph listing it cannot be imported
  (`import_meta_graph`: KeyError naming the op).
  """
  collection = tf.compat.v1.get_collection_ref(
      tf.compat.v1.GraphKeys.TRAIN_OP)
  added = [op for op in collection if not any(op is b for b in before)]
  if added:
    collection[:] = [op for op in collection if not any(op is a for a in added)]
    collection.append(train_op)


def claimed_names(graph):
  """The names of the accumulating train ops built in `graph` so far."""
  return set(_train_ops(graph).counters.values())


def _claim_counter(global_step, name):
  """Refuses a second train op incrementing the same counter: every run of
  both would count two micro-batches, and each window would end early."""
  claims = _train_ops().counters
  counter = variable_base_name(global_step)
  owner = claims.setdefault(counter, name)
  if owner != name:
    raise ValueError(
        f"global_step {counter} already counts the micro-batches of the "
        f"accumulating train op {owner!r}; the train op {name!r} would "
        "increment it too, twice per micro-batch. Give it a counter of its "
        "own: global_step=tf.compat.v1.get_variable(name, [], tf.int64, "
        "initializer=tf.compat.v1.zeros_initializer(), trainable=False).")


def _log_state_size(state):
  """Logs the memory the window's state takes, once per graph."""
  trained = sum(a.variable.shape.num_elements() *
                a.variable.dtype.base_dtype.size for a in state.accumulators)
  sizes = {"dense": 0, "masked": 0, "sharded": 0}
  compact = [a for a in state.accumulators if a.kind == "compact"]
  for accumulator in state.accumulators:
    if accumulator.kind == "compact":
      continue
    for variable in accumulator.state_variables():
      sizes[accumulator.kind] += (
          variable.shape.num_elements() * variable.dtype.base_dtype.size)
  total = sum(sizes.values())
  progress.log_info(
      "gradient accumulation: k=%d over %d variables; accumulators take "
      "%.1f MB (%.2fx the trained variables' %.1f MB; %.1f MB for masked "
      "tables, dense sums with row masks)", state.k, len(state.accumulators),
      total / 2**20, total / max(trained, 1), trained / 2**20,
      sizes["masked"] / 2**20)
  if compact:
    progress.log_info(
        "gradient accumulation: %d tables accumulated compactly, growing with "
        "the rows a window touches (not counted above): %s", len(compact),
        ", ".join(f"{variable_base_name(a.variable)} "
                  f"{a.bytes_per_row()} bytes per row touched, "
                  f"{_dense_mb(a.variable):.1f} MB dense" for a in compact))


def _dense_mb(variable):
  return (variable.shape.num_elements() * variable.dtype.base_dtype.size
          / 2**20)


@as_written
def get_accumulation_state(graph=None):
  """Returns the `AccumulationState` built in `graph` (default graph).

  Raises:
    ValueError: if no accumulating train op was built in the graph.
  """
  graph = graph or tf.compat.v1.get_default_graph()
  state = _train_ops(graph).state
  if state is None:
    raise ValueError("no accumulating train op was built in this graph; call "
                     "build_accumulating_train_op first.")
  return state


