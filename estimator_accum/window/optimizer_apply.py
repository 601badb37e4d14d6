"""The window's third part's last step (internal to estimator_accum): the
finished window's gradient handed to the optimizer, in the branch of a
finite window, one of three ways.

- One replica and an optimizer that `applies_in_one_pass` (models.bert's
  AdamWeightDecay on the CPU): it is handed the window's gradients and
  their scale (`gradients_scaled_by`) and updates each variable in one
  native op, fused_apply or not.
- `fused_apply` on one replica with dense gradients: the scale and the
  whole apply as one function XLA compiles, which updates the variables
  in place (or, where it cannot, each variable's update compiled apart,
  `apply_order.fuse`).
- Otherwise TensorFlow's ops, one variable at a time with
  `sequential_apply` (`apply_order.chain`).
"""

import contextlib

import tensorflow as tf
from absl import logging

from estimator_accum import tf_private
from estimator_accum.distribution import apply
from estimator_accum.window import apply_order, trained_checks
from estimator_accum.window.gradient_ops import (
  cast_gradient,
  scale_gradient,
  scale_unless_one,
)


class OptimizerApply:
  """Hands the finished window's gradient to the optimizer."""

  def __init__(self, plan, optimizer, accumulators):
    self._plan = plan
    self._settings = plan.settings
    self._optimizer = optimizer
    self._accumulators = accumulators
    self._variables = [a.variable for a in accumulators]

  # Cross-replica context, in the branch of a finite window.

  def apply(self, cross_replica, gradients, scale, moved):
    """The optimizer's update of every replica's copy, after `moved` (the
    batch_norm layers' moving statistics)."""
    dense = sparse_apply_is_dense_apply(self._optimizer)
    apart = compiled_apart_because(
        cross_replica.alone, gradients, self._variables,
        worker_device=self._plan.variables.local_device,
        sparse_as_dense=dense)
    if apart is None and applies_in_one_pass(self._optimizer,
                                             self._variables):
      return self._apply_in_one_pass(cross_replica, gradients, scale, moved,
                                     dense)
    traced = False
    if self._settings.fused_apply:
      if apart is None:
        if dense:
          gradients = self._densified(gradients)
        applied = self._apply_compiled(cross_replica, gradients, scale,
                                       moved)
        if applied is not None:
          return applied
        traced = True
      else:
        logging.info("fused_apply: each variable's update is compiled "
                     "apart: %s.", apart)
    gates = []
    gradients = cross_replica.each(self._ready_to_apply, gradients, scale,
                                   gates)
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    with tf.control_dependencies(moved), outer_name_scope(self._plan), (
        _reusing_variables() if traced else contextlib.nullcontext()):
      applied = apply.apply_reduced(
          cross_replica, self._optimizer, gradients, self._variables)
    made = set(graph.get_operations()[before:])
    for replica_gates in gates:
      if self._settings.fused_apply:
        apply_order.fuse(replica_gates, made)
      if self._settings.sequential_apply:
        apply_order.chain(replica_gates, made)
    return applied

  def _apply_in_one_pass(self, cross_replica, gradients, scale, moved,
                         dense):
    """One replica, an optimizer that `applies_in_one_pass`: it is handed
    the window's gradients and their scale (`gradients_scaled_by`), and
    updates each variable in one op, fused_apply or not: the values of
    the product and TensorFlow's ops, with no compile. A sparse gradient
    it densifies is densified first, as for the compiled apply."""
    if dense:
      gradients = self._densified(gradients)
    # In the variables' dtypes, unscaled and ungated: the optimizer's one
    # op a variable makes the product.
    gradients = self._ready_to_apply(gradients, None, gates=None)
    with tf.control_dependencies(moved), outer_name_scope(self._plan), (
        self._optimizer.gradients_scaled_by(scale)):
      return apply.apply_reduced(cross_replica, self._optimizer, gradients,
                                 self._variables)

  def _densified(self, gradients):
    """Each tf.IndexedSlices of `gradients` as the dense gradient its rows
    sum to (for an optimizer that `sparse_apply_is_dense_apply`)."""
    return [_densified(g, v) for g, v in zip(gradients, self._variables)]

  def _apply_compiled(self, cross_replica, gradients, scale, moved):
    """fused_apply on one replica with dense gradients: the gradients'
    scale and the optimizer's whole apply in one function XLA compiles
    (`jit_compile`), called from the branch.

    Such a function runs as one XlaLaunch, which writes the variables and
    slots in place: no new buffer for any of them, one pass over memory
    per variable. A jit scope instead (what `fuse` marks) runs by
    XlaCompile and XlaRun, which never alias a variable and write every
    updated variable and slot to a new buffer (benchmarks/xla_update.py).
    Slots are still created outside the control flow (the creator scope
    lifts them out of the function too), under the train op's name scope.

    Returns the apply's True tensor, or None where XLA cannot compile an
    op of the apply (Keras's amsgrad: ResourceApplyAdamWithAmsgrad): said
    once, and the traced function is never called (its slots, made while
    tracing, are the ones the apply then uses).
    """
    scaled = scale is not None

    def update(*inputs):
      window = list(inputs[1:] if scaled else inputs)
      with outer_name_scope(self._plan), tf.variable_creator_scope(_not_lifted):
        ready = self._ready_to_apply(
            window, inputs[0] if scaled else None, gates=None)
        return apply.apply_reduced(
            cross_replica, self._optimizer, ready, self._variables)

    compiled = tf.function(update, jit_compile=True, autograph=False)
    inputs = [*([scale] if scaled else []), *gradients]
    concrete = compiled.get_concrete_function(*inputs)
    device = self._variables[0].device
    cannot = tf_private.ops_xla_cannot_compile(
        concrete.function_def,
        concrete.graph.as_graph_def().library.function,
        "GPU" if "GPU" in device.upper() else "CPU")
    if cannot:
      logging.warning(
          "fused_apply: XLA cannot compile %s of %s's apply; each variable's "
          "update is compiled apart, those ops run as they are.",
          ", ".join(cannot), type(self._optimizer).__name__)
      return None
    with tf.control_dependencies(moved):
      return concrete(*inputs)

  def _ready_to_apply(self, gradients, scale, gates):
    """Replica context, in the apply's branch: the window's gradients as the
    optimizer takes them, times `scale` (clipping and the reduction's
    factor; None for 1), in the variables' dtypes. With sequential_apply
    each passes a gate first (appended to `gates`), so that its product
    and the optimizer's temporaries are made one variable at a time; with
    fused_apply too (where each variable's compiled update starts).
    `gates` None: inside the compiled apply, where XLA orders the work and
    a product costs no pass of its own; and for the one pass (`scale`
    None there too: the optimizer's op makes the product)."""
    sequential = self._settings.sequential_apply
    if gates is not None and (sequential or self._settings.fused_apply):
      gated = [apply_order.gate(g) for g in gradients]
      gradients = [g for g, _ in gated]
      gates.append([op for _, op in gated])
    if scale is not None:
      if (self._settings.clip_norm is None and not sequential and
          gates is not None):
        # Mostly 1: no product, and no copy of the model, then.
        gradients = scale_unless_one(scale, gradients)
      else:
        gradients = [scale_gradient(g, scale) for g in gradients]
    return [cast_gradient(g, a.variable.dtype.base_dtype)
            for g, a in zip(gradients, self._accumulators)]


def outer_name_scope(plan):
  """Enters, inside a branch, the name scope the train op was built in
(`plan.outer_scope`).

  The optimizer (or after_update) builds its ops there and creates its
  slots and step counts (`init_scope` keeps the name scope it is entered
  from) under the names plain `minimize` gives them: `beta1_power`,
  `Adam/iter`. Left in the branch's scope they would be named
  `gradient_accumulation/end_of_window/cond/beta1_power` under control
  flow v1, and lose the caller's scope under v2 (a branch's graph starts
  at the root): checkpoints would differ with the control flow version
  and from plain training's.
  """
  scope = plan.outer_scope
  return tf.compat.v1.get_default_graph().name_scope(
      scope + "/" if scope else "")


def _not_lifted(next_creator, **kwargs):
  """Variable creator inside the compiled apply: a variable the optimizer
  makes there (already outside the control flow: `create_outside_control_
  flow` runs first) is made as it is, not as the variable a function's
  first call lifts out of itself (`tf.function`'s own creator), which a
  `tf.compat.v1.get_variable` in a graph cannot make."""
  kwargs["experimental_enable_variable_lifting"] = False
  return next_creator(**kwargs)


@contextlib.contextmanager
def _reusing_variables():
  """Variables the optimizer creates by name (google-research/bert's
  AdamWeightDecay: `tf.compat.v1.get_variable`) are the ones a traced,
  uncalled apply already made: reused, not made twice."""
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                   reuse=tf.compat.v1.AUTO_REUSE,
                                   auxiliary_name_scope=False):
    yield


SPARSE_APPLY_IS_DENSE_APPLY = "sparse_apply_is_dense_apply"


def sparse_apply_is_dense_apply(optimizer):
  """Whether `optimizer` says (its attribute `sparse_apply_is_dense_apply`
  True) that it applies a tf.IndexedSlices gradient as the dense gradient
  its rows sum to: google-research/bert's AdamWeightDecay and LAMB
  (models.bert.optimization) decay every row's moments, so they densify
  it. fused_apply then hands it the dense gradient, and the whole apply
  compiles as one function: the same tensor the optimizer would have made
  (`tf.math.unsorted_segment_sum` of the rows, which the window holds
  unique: each sum is one row, exactly), made before the function instead
  of inside the optimizer."""
  return getattr(optimizer, SPARSE_APPLY_IS_DENSE_APPLY, False) is True


APPLIES_IN_ONE_PASS = "applies_in_one_pass"


def applies_in_one_pass(optimizer, variables):
  """Whether `optimizer` says (its method `applies_in_one_pass(variables)`
  returning True) that it can apply the window's gradients to `variables`
  times a scale in one op each: its `gradients_scaled_by(scale)` context
  then open while it is handed them, unscaled (models.bert's
  AdamWeightDecay on the CPU: a native kernel, the values of TensorFlow's
  ops bit for bit)."""
  says = getattr(optimizer, APPLIES_IN_ONE_PASS, None)
  return callable(says) and says(list(variables)) is True


def _densified(gradient, variable):
  if not isinstance(gradient, tf.IndexedSlices):
    return gradient
  return tf.math.unsorted_segment_sum(gradient.values, gradient.indices,
                                      tf.shape(variable)[0])


def compiled_apart_because(alone, gradients, variables,
                           worker_device=None, sparse_as_dense=False):
  """Why fused_apply cannot compile the whole apply as one function, or
  None where it can: on one replica outside any distribution strategy
  (`alone`),
  its variables on one device of its own task, with every gradient dense
  and every variable a resource variable. A
  table's sparse gradient touches a different number of rows each window
  (a shape XLA would compile anew, or pad: XLA's padded sparse updates of
  tf.compat.v1's Adam were found wrong), a strategy's replicas apply
  through its own cross-replica calls, and a function cannot assign a
  reference variable (control flow v1's): there each variable's update is
  marked for XLA instead (`apply_order.fuse`). `worker_device`: the
  plan's worker device in between-graph (parameter-server) training, or
  None. `sparse_as_dense`: the optimizer applies a sparse gradient as the
  dense one its rows sum to (`sparse_apply_is_dense_apply`), which
  fused_apply then hands it."""
  if not alone:
    return "the apply runs under a distribution strategy"
  # A compiled function reaches only resources on the device it runs on
  # (XLA's known issue "tf.Variable on a different device"): a parameter
  # server's, or another device's, is applied by ops placed with it.
  if worker_device is not None:
    return (f"the variables are on parameter servers, this worker's window "
            f"on {worker_device}")
  devices = sorted({v.device for v in variables})
  if len(devices) > 1:
    return f"variables on several devices ({', '.join(devices)})"
  sparse = [v.name for g, v in zip(gradients, variables)
            if isinstance(g, tf.IndexedSlices)]
  if sparse and not sparse_as_dense:
    return f"sparse gradients of {', '.join(sparse)}"
  refs = trained_checks.reference_variable_names(variables)
  if refs:
    return f"reference variables {', '.join(refs)}"
  return None
