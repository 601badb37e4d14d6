"""The window's apply, one variable at a time (`sequential_apply`).

An optimizer's apply makes temporaries the size of each variable (Adam's
new moments and update, the clipped gradient), and TensorFlow's executor
starts every variable's update at once: at the window's end the model's
size in temporaries several times over lies beside the weights, slots and
accumulators (BERT-Large at 512 tokens with recomputation: 2.3 GB more
than a micro-batch that only adds). Here each variable's gradient passes
a gate that opens when the previous variable's update has run, so the
temporaries of one variable live at a time. The values are the same;
only the order is fixed.

The gates are made before the optimizer builds its updates and told what
to wait for after (`chain`): the updates a gradient feeds are the stateful
ops downstream of its gate. Where one update reads the gradients of
several variables (a global norm inside the optimizer, Keras's
`global_clipnorm`), an order would deadlock: `chain` then leaves the
apply as it is.
"""

import collections

import tensorflow as tf

from estimator_accum import tf_private

# Ops that make or name a variable or a constant: never held back (a
# variable's initializer reads them).
_SOURCES = frozenset({"VarHandleOp", "VariableV2", "Const", "Placeholder",
                      "VarIsInitializedOp"})


def gate(gradient):
  """(the gradient through an identity op that `chain` can hold back, that
  op); a tf.IndexedSlices passes its values through it."""
  if isinstance(gradient, tf.IndexedSlices):
    values = tf.identity(gradient.values, name="apply_gate")
    return tf.IndexedSlices(values, gradient.indices,
                            gradient.dense_shape), values.op
  gated = tf.identity(gradient, name="apply_gate")
  return gated, gated.op


def _downstream(op):
  """`op` and the ops downstream of it in its graph (through data edges)."""
  seen, stack = {op}, [op]
  while stack:
    current = stack.pop()
    for output in current.outputs:
      for consumer in output.consumers():
        if consumer not in seen:
          seen.add(consumer)
          stack.append(consumer)
  return seen


def _updates_fed_by(op, downstream=None):
  """The stateful ops downstream of `op` (`downstream`: `_downstream(op)`,
  when already walked)."""
  return {o for o in downstream or _downstream(op)
          if o is not op and o.op_def.is_stateful}


def _owners(parts):
  """How many of `parts` (sets of ops) each op is in."""
  return collections.Counter(op for part in parts for op in part)


def _ancestors(ops, within):
  """The ops of `within` that `ops` depend on (data or control), and
  `ops` themselves."""
  seen, stack = set(), list(ops)
  while stack:
    current = stack.pop()
    if current in seen or current not in within:
      continue
    seen.add(current)
    stack.extend(t.op for t in current.inputs)
    stack.extend(current.control_inputs)
  return seen


def chain(gates, made):
  """Orders the apply: the ops of variable i's update wait for variable
  i - 1's updates. `gates`: the gate ops, in the variables' order; `made`:
  the ops the optimizer made for the apply in the gates' graph.

  Variable i's update is the stateful ops downstream of its gate and what
  they depend on among `made` that no other variable's update depends on
  (the learning rate, a step count are shared and left as they are); the
  first of those ops (and the gate) wait. Returns whether it ordered the
  apply (False: an update is fed by two gates, and nothing changed)."""
  fed = [_updates_fed_by(g) for g in gates]
  seen = set()
  for updates in fed:
    if updates & seen:
      return False
    seen |= updates
  parts = [_ancestors(updates, made) for updates in fed]
  owners = _owners(parts)
  previous = []
  context = tf_private.control_flow_context(gates[0]) if gates else None
  for gate_op, updates, part in zip(gates, fed, parts):
    own = {op for op in part if owners[op] == 1 and op.type not in _SOURCES
           and tf_private.control_flow_context(op) is context}
    first = [op for op in own
             if not any(t.op in own for t in op.inputs) and
             not any(c in own for c in op.control_inputs)]
    waits = sorted(previous, key=lambda o: o.name)
    for op in [gate_op, *sorted(first, key=lambda o: o.name)]:
      tf_private.add_control_inputs(op, waits)
    if updates:
      previous = list(updates)
  return True


# fused_apply ----------------------------------------------------------------

# Not compiled: ops that make or name a variable, a branch's captured input,
# and what XLA has no kernel for anyway.
_NOT_FUSED = _SOURCES | {"Placeholder", "NoOp"}


def fuse(gates, made):
  """Marks each variable's own update for XLA: one compiled loop per
  variable (its gradient's scale, the optimizer's arithmetic, the writes of
  the variable and its slots), instead of an op, and a pass over memory,
  for each step of the arithmetic.

  `gates`: the gate ops, in the variables' order; `made`: the ops the
  optimizer made for the apply. Call it before `chain` (whose control
  edges join the variables). A variable's own ops are those from its gate
  to its updates, and what its updates depend on among `made` that no
  other variable's update does; each set gets an XLA scope of its own, so
  that the updates stay one variable at a time. Ops XLA cannot compile run
  as they are.
  """
  parts = []
  for gate_op in gates:
    downstream = _downstream(gate_op)
    parts.append(_ancestors(_updates_fed_by(gate_op, downstream),
                            made | downstream))
  owners = _owners(parts)
  for index, part in enumerate(parts):
    for op in part:
      if owners[op] == 1 and op.type not in _NOT_FUSED:
        tf_private.mark_for_xla(op, f"estimator_accum_apply_{index}")
