"""The window's plan: what one build decides, once, before any op is made.

`make_plan` reads the checked options (`WindowSettings`) and the
micro-batch (its gradients, where it runs) and decides everything the
window's parts then only read: k and the replicas, the window's size, the
reduction, where the accumulators live and of which kind each is, how each
crosses replicas (the wire dtype, the table layout, the send order), and
the factory that makes the window's variables. Each part of the window
(`accumulate.Accumulation`, `communication.Communication`,
`finish.Finish`, `bookkeeping.Bookkeeping`) takes the plan; none decides
any of it again.
"""

import contextlib
import dataclasses

import tensorflow as tf
from absl import logging

from estimator_accum import releases
from estimator_accum.checkpoints.state_variables import StateVariables
from estimator_accum.distribution import replicas
from estimator_accum.window import communication, sharded
from estimator_accum.window.compact import choose_compact


@dataclasses.dataclass(frozen=True)
class WindowPlan:
  """What one build of the window decided (see the module's docstring).

  Attributes:
    settings: the checked options (`options.WindowSettings`), k among them.
    replicas: the replicas in sync.
    reduction: the `reductions.Reduction` the options chose.
    kinds: per trained variable, its accumulator's kind: "dense",
      "masked" (a table's dense sum with a row mask), "compact" (a table's
      touched rows only) or "sharded" (this replica's slice).
    rows_blocks: per trained variable, the rows its window crosses replicas
      in when sent by its touched rows, else None (the table layout).
    send_order: the variables' indices in the order the backward pass makes
      their gradients: the order the window's sums are sent in.
    wire: the dtype the window's sums cross replicas in, or None (float32).
    variables: the `StateVariables` factory making the window's state.
    outer_scope: the name scope the train op is built in.
  """

  settings: object
  replicas: int
  reduction: object
  kinds: tuple
  rows_blocks: tuple
  send_order: tuple
  wire: object
  variables: StateVariables
  outer_scope: str

  @property
  def k(self):
    """Micro-batches per window, on each replica."""
    return self.settings.k

  @property
  def window_size(self):
    """Micro-batches per window over every replica: k x replicas."""
    return self.settings.k * self.replicas

  @property
  def name(self):
    return self.settings.name

  @property
  def sharded(self):
    return self.settings.accumulator_placement == "sharded"

  def placement(self):
    """The scope the accumulators are made in, and so where their adds
    run (resource ops run on their variable's device): beside the
    variables, or in the host's memory."""
    if self.settings.accumulator_placement == "host":
      return tf.device("/device:CPU:0")
    return contextlib.nullcontext()


def make_plan(settings, trained, reduction, local_device, outer_scope):
  """The `WindowPlan` of one build.

  Args:
    settings: the checked `WindowSettings`.
    trained: the micro-batch's [(gradient, variable)].
    reduction: the `reductions.Reduction` the options chose.
    local_device: the worker's device in between-graph training, or None.
    outer_scope: the name scope the train op is built in.

  Raises:
    ValueError: an accumulator placement this build cannot have.
  """
  settings = _without_failing_xla(settings, [v for _, v in trained])
  _check_xla_auto_clustering(trained)
  count = replicas.num_replicas()
  placement = settings.accumulator_placement
  if placement == "host" and (count > 1 or local_device is not None):
    raise ValueError(
        "accumulator_placement='host' keeps one replica's window in host "
        f"memory; this train op has {count} replicas"
        f"{' on a parameter-server worker' if local_device else ''}. Use "
        "'device'.")
  if placement == "sharded":
    sharded.check(count, reduction, local_device)
  compact = choose_compact(trained, settings.sparse_accumulation,
                           settings.sparse_threshold_bytes,
                           settings.accumulator_dtype, count)
  kinds = tuple(_kind(g, c, placement) for (g, _), c in zip(trained, compact))
  blocks = tuple(
      communication.rows_block(kind, v, g, settings.table_all_reduce, count,
                               settings.k, settings.accumulator_dtype)
      for kind, (g, v) in zip(kinds, trained))
  return WindowPlan(
      settings=settings, replicas=count, reduction=reduction, kinds=kinds,
      rows_blocks=blocks,
      send_order=tuple(communication.ready_order([g for g, _ in trained])),
      wire=settings.communication_dtype if count > 1 else None,
      variables=StateVariables(local_device), outer_scope=outer_scope)


def _without_failing_xla(settings, variables):
  """`settings`, with fused_apply off where every XLA compile of the
  window's end would fail on its CPU (`releases.xla_cache_fails_on_cpu`):
  said in one line, and the end runs as TensorFlow's ops (the same
  update), instead of an InternalError at the first window's end."""
  flags = releases.xla_cache_fails_on_cpu() if settings.fused_apply else None
  if flags is None or not _on_cpu(variables):
    return settings
  # Once a process: the planner builds the window once per candidate.
  logging.log_first_n(
      logging.WARNING,
      "fused_apply: TF_XLA_FLAGS=%r turns on XLA's persistent cache for the "
      "CPU, where TensorFlow 2.15 fails every XLA compile (TargetRegistry::"
      "lookupTarget, triple \"unknown\"): the window's end runs without "
      "XLA (the same update). To keep the cache for GPUs only, add "
      "--tf_xla_persistent_cache_device_types=GPU.", 1, flags)
  return dataclasses.replace(settings, fused_apply=False)


def _on_cpu(variables):
  """Whether `variables` live on a CPU (unplaced ones where no GPU is)."""
  devices = {v.device.upper() for v in variables}
  return not (any("GPU" in d for d in devices) or (
      "" in devices and tf.config.list_physical_devices("GPU")))


def _check_xla_auto_clustering(trained):
  """Refuses, in one line, XLA's auto-clustering on the CPU of a window
  with a table's (sparse) gradient: XLA aborts the process at the first
  micro-batch (releases.xla_auto_clustering_on_cpu), where the same
  model without the window trains."""
  flags = releases.xla_auto_clustering_on_cpu()
  if flags is None:
    return
  tables = [v.name.split(":")[0] for g, v in trained
            if isinstance(g, tf.IndexedSlices)]
  if not tables or not _on_cpu([v for _, v in trained]):
    return
  raise ValueError(
      f"TF_XLA_FLAGS={flags!r} clusters the graph for XLA on the CPU, and "
      f"XLA aborts the process on the window of a table's gradient "
      f"({', '.join(tables[:3])}): unset --tf_xla_cpu_global_jit (or set "
      f"--tf_xla_auto_jit=0), or keep XLA to the ops it fuses "
      f"(--tf_xla_ops_to_cluster=FUSIBLE); fused_apply=True compiles the "
      f"window's end alone with XLA.")


def _kind(gradient, compact, placement):
  if compact:
    return "compact"
  if isinstance(gradient, tf.IndexedSlices):
    return "masked"
  return "sharded" if placement == "sharded" else "dense"
