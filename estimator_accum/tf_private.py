"""The library's door to TensorFlow's private API of graphs, distribution,
optimizers and checkpoints, one function each (its runtime's:
`runtime_private.py`).

Written for TensorFlow 2.15 and checked on every release to 2.21 (where a
name moved, the function says both places; `releases.py` says which
TensorFlow and Keras run). Each
function names the private attribute, call or module it uses and why no
public API serves; `tests/unit/test_tf_private.py` runs each against the
installed TensorFlow, so that an upgrade that moves a name fails there, in
one place, and not deep inside training. No module of the library but
these two reads or writes a private name of TensorFlow's (ruff's SLF rule
and `tests/test_design.py` check it).

The library's classes also override private hooks of TensorFlow's base
classes, which is how TensorFlow itself extends them; `OVERRIDDEN_HOOKS`
lists them, and the test checks each still exists on its base.
"""

import contextlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from estimator_accum import releases

# (base class, private method) the library's subclasses override: a
# tf.compat.v1 optimizer's checkpoint hooks (its slots are restored through
# them before the window is built) and a Keras optimizer's.
OVERRIDDEN_HOOKS = (
    (tf.compat.v1.train.Optimizer, "_create_or_restore_slot_variable"),
    (tf.compat.v1.train.Optimizer, "_lookup_dependency"),
    *((legacy, "_create_or_restore_slot_variable")
      for legacy in releases.keras_legacy_optimizer_types()),
    # (how a SavedModel save is told, either kind)
    (tf.keras.optimizers.Optimizer, "_trackable_children"),
    *((legacy, "_trackable_children")
      for legacy in releases.keras_legacy_optimizer_types()),
)

# Graph surgery ------------------------------------------------------------


def reroute(old, new):
  """Makes every consumer of the tensor `old` read `new` instead.

  `tf.Operation._update_input`: ops are immutable through the public API,
  and a random op made by the user's own code (dropout's
  `tf.random.uniform`) has to be replaced by its stateless twin after it
  was made, so that a recomputation can draw the same values again.

  Args:
    old: tf.Tensor whose consumers change.
    new: tf.Tensor of the same dtype and a compatible shape, in the same graph.
  """
  for consumer in list(old.consumers()):
    for index, tensor in enumerate(consumer.inputs):
      if tensor is old:
        consumer._update_input(index, new)  # noqa: SLF001


def add_control_inputs(op, control_inputs):
  """Makes `op` wait for `control_inputs` (ops of its graph).

  `tf.Operation._add_control_inputs`: control inputs are otherwise given
  only when an op is made, and the window's gates have to be made before
  the optimizer builds the updates they wait for.
  """
  if control_inputs:
    op._add_control_inputs(control_inputs)  # noqa: SLF001


def mark_for_xla(op, scope):
  """Asks XLA to compile `op`, with the other ops of `scope` only.

  The attributes `tf.xla.experimental.jit_scope` sets on the ops made in
  it (`_XlaCompile`, `_XlaScope`): TensorFlow's clustering pass compiles
  marked ops on the CPU too (without global auto-clustering), and never
  joins ops of two scopes into one cluster. Set on ops already made:
  an optimizer builds every variable's update in one call.
  """
  op._set_attr("_XlaCompile", attr_value_pb2.AttrValue(b=True))  # noqa: SLF001
  op._set_attr("_XlaScope", attr_value_pb2.AttrValue(  # noqa: SLF001
      s=scope.encode()))


_XLA_KERNELS_REGISTERED = []


def ops_xla_cannot_compile(function_def, library, device_type):
  """The op types of `function_def` (a FunctionDef) and of `library` (the
  FunctionDefs it may call) that XLA has no kernel for on `device_type`
  ("CPU" or "GPU"), sorted.

  `tensorflow.python.framework.kernels.get_registered_kernels_for_op`:
  XLA registers its kernels (device "XLA_CPU_JIT", "XLA_GPU_JIT") in
  TensorFlow's kernel registry, but only once something in the process has
  compiled; a one-op function compiled in a CPU-only session of its own
  makes sure of that. Without this a `jit_compile` function fails at its first run
  ("Detected unsupported operations"), not when it is built.
  """
  from tensorflow.python.framework import kernels  # noqa: PLC0415

  if not _XLA_KERNELS_REGISTERED:
    # On the CPU alone: a session with a GPU would set up the process's GPU
    # allocator before the job's own session could ask for its options.
    with tf.Graph().as_default(), tf.compat.v1.Session(
        config=tf.compat.v1.ConfigProto(device_count={"GPU": 0})) as session:
      session.run(tf.function(lambda: tf.constant(1.0) * 2.0,
                              jit_compile=True, autograph=False)())
    _XLA_KERNELS_REGISTERED.append(True)
  jit_device = f"XLA_{device_type}_JIT"
  types = {node.op for node in function_def.node_def}
  for nested in library:
    types |= {node.op for node in nested.node_def}
  functions = {nested.signature.name for nested in library}
  return sorted(
      t for t in types - functions
      if not any(k.device_type == jit_device
                 for k in kernels.get_registered_kernels_for_op(t).kernel))


def control_flow_context(op_or_graph):
  """The control-flow (v1) context an op was made in, or a graph is
  building in now; None outside any.

  `_get_control_flow_context` of tf.Operation and tf.Graph: control flow
  v1 keeps it there only. An op made inside a `tf.compat.v1.cond` branch
  must not wait for an op outside it; and a graph compiled by XLA is told
  by its context alone."""
  return op_or_graph._get_control_flow_context()  # noqa: SLF001


def mark_loss_mean_over_replicas(graph):
  """Sets `tf.Graph._is_loss_scaled_by_optimizer`, as `optimizer.minimize`
  does: Estimator reads it to report the replicas' mean loss, not their
  sum, and has no public way to be told."""
  graph._is_loss_scaled_by_optimizer = True  # noqa: SLF001


def loss_marked_mean_over_replicas(graph):
  """Whether `mark_loss_mean_over_replicas` (or a v1 optimizer's
  `minimize`) marked `graph`: `tf.Graph._is_loss_scaled_by_optimizer`."""
  return getattr(graph, "_is_loss_scaled_by_optimizer", False)


def last_loss_reduction(graph):
  """The reduction the graph's last `tf.compat.v1.losses` loss (or Keras
  loss) was built with, or None: `tf.Graph._last_loss_reduction`, which
  TensorFlow's own v1 optimizers read to decide whether to divide by the
  replicas; no public API reports it."""
  return getattr(graph, "_last_loss_reduction", None)


# Distribution -------------------------------------------------------------


def replicas_in_sync(variable):
  """The number of replicas of the strategy that made the distributed
  `variable`: `DistributedVariable._distribute_strategy`, as a variable
  restored outside its strategy's scope does not say otherwise."""
  return variable._distribute_strategy.num_replicas_in_sync  # noqa: SLF001


def report_as_mirrored(value, make_container):
  """Makes `strategy.reduce` of the tensor `value` take the
  `tf.distribute` Mirrored value `make_container()` returns (None: `value`
  as it is); `mirrored` makes one.

  `tf.Tensor._distributed_container`: MultiWorkerMirroredStrategy's
  Estimator reduces each worker's loss through it, and the window reports
  each worker's own mean there."""
  value._distributed_container = make_container  # noqa: SLF001


def mirrored(tensors):
  """`tensorflow.python.distribute.values.Mirrored` of per-device
  `tensors`: the type a strategy's reduce hands back as it is; not
  exported."""
  from tensorflow.python.distribute import values  # noqa: PLC0415

  return values.Mirrored(tuple(tensors))


def local_copy(variable):
  """This replica's (or this device's) own component of the distributed
  `variable` (`DistributedVariable._get_on_device_or_primary`), or the
  variable itself when it is not distributed."""
  get = getattr(variable, "_get_on_device_or_primary", None)
  return variable if get is None else get()


# Optimizers ---------------------------------------------------------------


def applies_through_distributed_apply(optimizer):
  """Whether the tf.compat.v1 `optimizer` applies through the base class's
  private `_distributed_apply` (whose first step is the all-reduce): not
  one with an `apply_gradients` of its own (Google's AdamWeightDecay)."""
  base = tf.compat.v1.train.Optimizer
  return (isinstance(optimizer, base) and
          type(optimizer).apply_gradients is base.apply_gradients and
          type(optimizer)._distributed_apply is base._distributed_apply)  # noqa: SLF001


def distributed_apply(optimizer, strategy, grads_and_vars):
  """Calls the tf.compat.v1 optimizer's `_distributed_apply`, the
  cross-replica half of `apply_gradients`, with `strategy`: the window
  runs it with its all-reduce taken out (the gradients are reduced)."""
  return optimizer._distributed_apply(strategy, grads_and_vars)  # noqa: SLF001


@contextlib.contextmanager
def distributed_apply_strategy(optimizer, wrap):
  """A scope in which the tf.compat.v1 `optimizer`'s `_distributed_apply`
  is given `wrap(strategy)` for the strategy it is called with; restored
  after. Its `apply_gradients` merges into that private method with no
  way to say the gradients are already reduced."""
  own = vars(optimizer).get("_distributed_apply")
  original = optimizer._distributed_apply  # noqa: SLF001

  def replaced(distribution, *args, **kwargs):
    return original(wrap(distribution), *args, **kwargs)

  optimizer._distributed_apply = replaced  # noqa: SLF001
  try:
    yield
  finally:
    if own is None:
      del optimizer._distributed_apply  # noqa: SLF001
    else:
      optimizer._distributed_apply = own  # noqa: SLF001


def create_or_restore_slot_variable(optimizer, position, slot_name, variable):
  """Calls `optimizer._create_or_restore_slot_variable`: a checkpoint
  restored before the slots exist hands them to the optimizer through it
  (the wrapper passes on those of the optimizer it wraps)."""
  return optimizer._create_or_restore_slot_variable(  # noqa: SLF001
      position, slot_name, variable)


def tensor_attributes(optimizer):
  """{attribute name: value} of `optimizer`'s own attributes and, for a
  Keras legacy optimizer, its private `_hyper` hyperparameters: where
  either kind keeps a learning rate that may be a tensor. No public API
  lists an optimizer's hyperparameters."""
  values = dict(vars(optimizer))
  values.update(getattr(optimizer, "_hyper", {}))
  return values


def adagrad_da_global_step(optimizer):
  """The `global_step` an AdagradDAOptimizer was built with (kept private
  as `_global_step`; its update reads the count)."""
  return optimizer._global_step  # noqa: SLF001


def v1_loss_scale_parts(optimizer):
  """(inner optimizer, loss scale) of a tf.compat.v1
  MixedPrecisionLossScaleOptimizer: private `_optimizer` and `_loss_scale`,
  which it does not expose."""
  return optimizer._optimizer, optimizer._loss_scale  # noqa: SLF001


def fixed_loss_scale_value(loss_scale):
  """The value of a tf.compat.v1 FixedLossScale (`_loss_scale_value`; its
  public `__call__` makes a tensor)."""
  return float(loss_scale._loss_scale_value)  # noqa: SLF001


# Checkpoints --------------------------------------------------------------


def checkpoint_object_graph(reader):
  """The object graph of the checkpoint `reader` reads (a
  `tf.train.load_checkpoint`), from its `_CHECKPOINTABLE_OBJECT_GRAPH` entry:
  a `TrackableObjectGraph` proto (`tensorflow.core.protobuf`, not exported),
  which says under which key each object's variables are stored."""
  from tensorflow.core.protobuf import (  # noqa: PLC0415
    trackable_object_graph_pb2,
  )

  return trackable_object_graph_pb2.TrackableObjectGraph.FromString(
      reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))


def saveable_factories(variable):
  """The variable's private `_gather_saveables_for_checkpoint()`: what a
  name-based Saver saves of it."""
  return variable._gather_saveables_for_checkpoint()  # noqa: SLF001


def replace_saveable_factories(variable, gather):
  """Makes a name-based Saver save `variable` with `gather()` (its
  `_gather_saveables_for_checkpoint`, on the instance): no public hook
  orders a variable's save after another op."""
  variable._gather_saveables_for_checkpoint = gather  # noqa: SLF001


def map_saveable_tensors(saveable, change):
  """Replaces each tensor a SaveableObject saves (`SaveSpec._tensor`, a
  tensor or a callable making one) with `change(tensor)`."""
  for spec in saveable.specs:
    spec._tensor = change(spec._tensor)  # noqa: SLF001
  return saveable


def track_child(owner, name, child):
  """Tracks `child` as `owner`'s checkpoint dependency `name`
  (`_track_trackable`, overwriting), and restores into it what a checkpoint
  loaded before it existed holds for it (`_handle_deferred_dependencies`):
  the window's state is made after Keras's `load_weights`."""
  owner._track_trackable(child, name=name, overwrite=True)  # noqa: SLF001
  restore_deferred(owner, name, child)


def restore_deferred(owner, name, child):
  """Restores into `child` what a loaded checkpoint holds for `owner`'s
  dependency `name` (`_handle_deferred_dependencies`)."""
  owner._handle_deferred_dependencies(name=name, trackable=child)  # noqa: SLF001


def deferred_dependency_names(owner):
  """The names of `owner`'s dependencies a loaded checkpoint holds and no
  object claimed yet (`_deferred_dependencies`)."""
  return list(owner._deferred_dependencies)  # noqa: SLF001


def trackable_children(trackable):
  """{name: child} of a trackable (`_trackable_children`, which
  `tf.train.Checkpoint` walks and no public API lists)."""
  return trackable._trackable_children()  # noqa: SLF001


def restored_checkpoint(position):
  """(object graph, path) of the checkpoint a CheckpointPosition restores
  from: its TrackableObjectGraph proto and its save path
  (`_checkpoint.object_graph_proto`, `_checkpoint.save_path_string`)."""
  coordinator = position._checkpoint  # noqa: SLF001
  return coordinator.object_graph_proto, coordinator.save_path_string
