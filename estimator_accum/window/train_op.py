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
from estimator_accum.checkpoints.state_variables import variable_base_name
from estimator_accum.distribution import replicas
from estimator_accum.distribution.placement import between_graph_worker_device
from estimator_accum.options import (
  WindowSettings,
  takes_window_options,
)
from estimator_accum.window import loss_scale as _loss_scale
from estimator_accum.window import progress, reductions
from estimator_accum.window import reports as window_reports
from estimator_accum.window.batch_norm import close_window_statistics
from estimator_accum.window.compact import (
  choose_compact,
)
from estimator_accum.window.gradient_ops import first_tensor
from estimator_accum.window.state import AccumulationState
from estimator_accum.window.step_counting import check_optimizer_steps
from estimator_accum.window.window import Window

__all__ = ["AccumulationState", "build_accumulating_train_op",
           "get_accumulation_state"]


@as_written
@takes_window_options()
def build_accumulating_train_op(loss, optimizer, k, *, global_step=None,
                                var_list=None, num_examples=None,
                                colocate_gradients_with_ops=False, **options):
  """Returns a train op that applies one update every `k` micro-batches.

  Call it where you would call `optimizer.minimize(loss, global_step)`, e.g.
  in a `model_fn`:

  ```python
  def model_fn(features, labels, mode, params):
    loss = ...
    optimizer = tf.compat.v1.train.AdamOptimizer(1e-3)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimizer, k=params["k"], clip_norm=1.0)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        training_hooks=[estimator_accum.AccumulationLoggingHook()])
  ```

  The contract:

  - Window: micro-batches are grouped in windows of k (on each replica).
    The k-th micro-batch of a window (`(global_step + 1) % k == 0`) applies
    one update; the other k-1 call no optimizer: no weight, slot or
    optimizer counter moves.
  - Scaling: the update's gradient is the mean over the window's
    micro-batches and over every replica and worker, all-reduced once per
    window (weighted by `num_examples` if given; the sum with
    `reduction="sum"`). Do not divide the loss by k or by the number of
    replicas.
  - Counting: `global_step` counts micro-batches (so Estimator's `max_steps`
    does too), incremented by one after each micro-batch's work; use
    `update_count(k)` for schedules that count updates (a hyperparameter
    computed from `global_step` itself is warned about, and an
    AdagradDAOptimizer given it is refused: its update reads the count).
  - Clipping: `clip_norm` clips the window's mean by global norm, as
    clipping the big batch would, not each micro-batch.
  - Non-finite windows: a window whose gradient holds a NaN or Inf is
    skipped whole (no update, accumulators zeroed, `skipped_windows` + 1, a
    warning); after `max_consecutive_skipped_windows` skipped in a row the
    run stops with an InvalidArgumentError saying "training diverged".
  - Resume: the window in progress (its sums, counts and divisor) is saved
    in checkpoints and restored exactly; a run resumed with another k or
    number of replicas ends that window at its next multiple of k, as the
    mean of what it holds. A step that fails for want of input (the end of
    a finite dataset) adds nothing to the window; a window the input ends in
    stays in the checkpoint, not applied.
  - Refused, with an error naming the argument: eager execution or a
    tf.function, cross-replica context, a second train op on the same
    counter, ProximalAdagrad under a strategy, compact sparse accumulation
    over several replicas, and the argument errors listed under Raises.

  Args:
    loss: scalar floating-point tf.Tensor, the loss of one micro-batch,
      averaged over its examples (or summed, with `reduction="sum"`).
    optimizer: a `tf.compat.v1.train.Optimizer` (any subclass, including
      BERT's AdamWeightDecay) or a `tf.keras.optimizers.legacy.Optimizer`.
    k: int >= 1, micro-batches per update.
    global_step: int64 scalar variable counting micro-batches; default
      `tf.compat.v1.train.get_or_create_global_step()`. It is incremented by
      one every micro-batch, after the accumulate/apply work.
    var_list: list of tf.Variable to train; default all trainable variables.
    num_examples: optional scalar tensor, the number of examples in this
      micro-batch. Each micro-batch's gradient is then weighted by its size,
      so a window with a short micro-batch equals its big batch exactly.
    colocate_gradients_with_ops: bool, passed to `tf.gradients`.
    WINDOW_OPTIONS

  Returns:
    A tf.Operation: run it once per micro-batch.

  Raises:
    TypeError: `k` is not an int, `loss` is not a floating tensor,
      `optimizer` is not an optimizer this function can drive, `global_step`
      is not an integer variable, or another argument has the wrong type.
    ValueError: `k < 1`, `loss` or `global_step` is not a scalar, no
      trainable variable has a gradient, `name` is not a scope name, an
      AdagradDAOptimizer counts its steps with `global_step`, or the
      arguments conflict.
    RuntimeError: called eagerly, or in cross-replica context.
  """
  settings = WindowSettings.checked(
      k, **options, gradient_options=dict(
          colocate_gradients_with_ops=colocate_gradients_with_ops))
  train_op, _ = accumulating_train_op(
      loss, None, optimizer, settings, global_step=global_step,
      var_list=var_list, num_examples=num_examples)
  return train_op


def accumulating_train_op(loss, grads_and_vars, optimizer, settings, *,
                          global_step, var_list, num_examples=None,
                          scaled_by_caller=False):
  """`build_accumulating_train_op`, from a loss or from one micro-batch's
  `grads_and_vars` (then `loss` is None), as `AccumulatingOptimizer`'s
  `minimize` and `apply_gradients` call it; `settings` is a
  `WindowSettings`, checked already. `scaled_by_caller`: the gradients
  given come from a loss the caller scaled with the window's loss scale
  and were unscaled by the caller (Keras's `get_scaled_loss`), so that the
  window only skips and moves the scale. Returns (the train op, its
  `Window`)."""
  (grads_and_vars, optimizer, loss_scale_config, global_step, var_list,
   num_examples, reduction) = _check_inputs(
       loss, grads_and_vars, optimizer, settings, global_step, var_list,
       num_examples, scaled_by_caller)
  variables_named = "variables in var_list"
  if grads_and_vars is None and var_list is None:
    variables_named = "trainable variables"
    var_list = _trainable_variables(loss)
  outer_scope = tf.compat.v1.get_default_graph().get_name_scope()
  train_ops_before = list(tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.TRAIN_OP))
  with tf.compat.v1.name_scope(settings.name):
    scaler = None
    if grads_and_vars is None:
      if loss_scale_config is not None:
        scaler = _loss_scale.LossScaler(loss_scale_config, settings.name)
      trained = _micro_batch_gradients(loss, var_list, variables_named, scaler,
                                       dict(settings.gradient_options))
      # What the micro-batch is computed from: its input pipeline, its device.
      source = loss
    else:
      if loss_scale_config is not None:
        scaler = _loss_scale.LossScaler(loss_scale_config, settings.name,
                                        unscales=False)
      trained, source = _given_gradients(grads_and_vars)
    _checks.check_ref_variables(trained, optimizer)
    window = Window(
        trained, optimizer, settings, global_step, reduction,
        loss_scaler=scaler,
        local_device=between_graph_worker_device(source, global_step),
        compact=choose_compact(
            trained, settings.sparse_accumulation,
            settings.sparse_threshold_bytes, settings.accumulator_dtype,
            replicas.num_replicas()),
        outer_scope=outer_scope,
        progress=progress.progress_line(
            settings.name, settings.k, settings.log_every_n_micro_batches))
    examples = window_reports.micro_batch_examples(source, num_examples)
    # A loss reportable_loss was given first needs no NaN line of its own:
    # Estimator trains on, and the window's end says it skipped.
    accumulated = window.accumulate_micro_batch(
        None if loss is None or window_reports.is_reported(loss) else loss)
    train_op = replicas.merge(
        window.end_micro_batch, accumulated,
        *((examples,) if examples is not None else ()))
  _replace_train_ops(train_ops_before, train_op)
  _record_state(window, examples)
  return train_op, window


def _check_inputs(loss, grads_and_vars, optimizer, settings, global_step,
                  var_list, num_examples, scaled_by_caller):
  """Checks what the graph gives: the loss or gradients, the optimizer, the
  counter, var_list, num_examples and the replica context. Returns
  (grads_and_vars as a list, the optimizer unwrapped, its loss-scale config
  or None, global_step, var_list, num_examples, the window's
  `reductions.Reduction`), the counter claimed for
  this train op."""
  _checks.check_graph_mode()
  if grads_and_vars is None:
    _checks.check_loss(loss)
  else:
    grads_and_vars = _checks.check_grads_and_vars(grads_and_vars)
  optimizer, loss_scale_config = _loss_scale.unwrap_optimizer(
      optimizer, settings.loss_scale,
      loss if grads_and_vars is None else
      first_tensor(g for g, _ in grads_and_vars))
  _checks.check_optimizer(optimizer)
  if (grads_and_vars is not None and loss_scale_config is not None and
      not scaled_by_caller):
    raise ValueError(
        "loss_scale needs the loss, to scale it before the gradients are "
        "taken; apply_gradients is given gradients already taken. Call "
        "AccumulatingOptimizer.minimize(loss, ...) instead, or pass "
        "loss_scale=None and an optimizer that is not a loss-scale wrapper.")
  _checks.warn_bypassed_compute_gradients(optimizer)
  _checks.check_global_step(global_step)
  var_list = _checks.check_var_list(var_list)
  num_examples = _checks.check_num_examples(num_examples)
  reduction = reductions.for_options(settings.reduction, num_examples)
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
  return (grads_and_vars, optimizer, loss_scale_config, global_step,
          var_list, num_examples, reduction)


def _trainable_variables(loss):
  """The graph's trainable variables, once each; ValueError if none."""
  var_list = (tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
  var_list = list({id(v): v for v in var_list}.values())
  if not var_list:
    raise ValueError(
        f"loss {loss.name} cannot be trained: the graph has no trainable "
        "variables.")
  return var_list


def _given_gradients(grads_and_vars):
  """([(gradient, variable)] without the Nones, a tensor of the micro-batch
  to place its window by); ValueError if every gradient is None."""
  trained = [(g, v) for g, v in grads_and_vars if g is not None]
  if not trained:
    raise ValueError(
        f"grads_and_vars has no gradient (all {len(grads_and_vars)} are "
        "None): the loss does not depend on any of the variables.")
  return trained, first_tensor(g for g, _ in trained)


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


def _micro_batch_gradients(loss, var_list, variables_named, scaler, options):
  """[(gradient, variable)] of `loss` (scaled by `scaler`, if any) for the
  variables of `var_list` it reaches; ValueError if none."""
  if loss.shape.rank is None:
    # A rank unknown until it runs: checked then, before the gradients,
    # as tf.gradients would silently differentiate a non-scalar loss's sum.
    check = tf.debugging.assert_rank(
        loss, 0, message=f"loss {loss.name} must be a scalar (rank 0); "
        "reduce it first, e.g. tf.reduce_mean(per_example_loss).")
    with tf.control_dependencies([check]):
      loss = tf.identity(loss)
  scaled_loss = loss if scaler is None else scaler.scale_loss(loss)
  gradients = tf.compat.v1.gradients(scaled_loss, var_list, **options)
  trained = [(g, v) for g, v in zip(gradients, var_list) if g is not None]
  if not trained:
    raise ValueError(
        f"loss {loss.name} has no gradient with respect to any of the "
        f"{len(var_list)} {variables_named}; check that the loss depends "
        "on them (var_list, stop_gradient, integer casts).")
  return trained


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


