"""Recompute a block's activations in the backward pass, exactly.

    @estimator_accum.recompute
    def block(x):
      h = tf.compat.v1.layers.dense(x, 4096, tf.nn.gelu, name="up")
      h = tf.nn.dropout(h, rate=0.1)
      return tf.compat.v1.layers.dense(h, 1024, name="down") + x

The forward pass runs as it would without the decorator, with the same
variables under the same names. Of the block's activations only its inputs
stay until the backward pass; there the block runs again, once the gradient
of its outputs exists, and its gradient is taken through that second run.
Two things make it exact and make it save memory, where TensorFlow's own
`tf.recompute_grad` does neither in a graph:

- Random ops draw the same values twice. Each stateful random op the block
  makes (dropout's uniform draw, a normal or truncated normal draw) is
  replaced by its stateless twin, seeded from a seed the block draws once
  per run; the recomputation reads that seed. The gradient is the gradient
  of the forward pass that ran, mask and all.
- The recomputation waits. Every recomputed op that reads nothing else
  recomputed waits, by a control dependency, for the gradient arriving at
  the block's outputs, so that the executor cannot run it early and keep
  its activations beside every other block's.

What cannot be recomputed is refused when the block is built, in one line
naming the op: an op that changes state (an assign, a queue, a stateful
random op with no stateless twin), and control flow (its gradient needs the
forward op itself).
"""

import functools

import tensorflow as tf

from estimator_accum import tf_private

# Stateful random op -> how to draw the same distribution statelessly.
_STATELESS = {
    "RandomUniform": lambda op, seed: tf.random.stateless_uniform(
        op.inputs[0], seed, dtype=op.get_attr("dtype")),
    "RandomStandardNormal": lambda op, seed: tf.random.stateless_normal(
        op.inputs[0], seed, dtype=op.get_attr("dtype")),
    "TruncatedNormal": lambda op, seed: tf.random.stateless_truncated_normal(
        op.inputs[0], seed, dtype=op.get_attr("dtype")),
    "RandomUniformInt": lambda op, seed: tf.random.stateless_uniform(
        op.inputs[0], seed, minval=op.inputs[1], maxval=op.inputs[2],
        dtype=op.get_attr("Tout")),
}
# Read again, not copied: the variable itself, and values that cost no
# activation memory.
_SOURCES = frozenset({"VarHandleOp", "VariableV2", "Const", "Placeholder",
                      "PlaceholderWithDefault"})
# Stateful by TensorFlow's flag, harmless to run twice.
_REPEATABLE = frozenset({"ReadVariableOp", "Assert"})
_CONTROL_FLOW = frozenset({
    "Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond",
    "RefSwitch", "RefMerge", "RefEnter", "RefExit", "If", "StatelessIf",
    "While", "StatelessWhile", "Case", "StatelessCase", "PartitionedCall",
    "StatefulPartitionedCall"})
_SEED_MAX = 2**62


def recompute(fn):
  """Decorates `fn`, a block of a graph, so that its activations are
  recomputed in the backward pass instead of kept from the forward pass.

  Use it on a block whose internal activations are much larger than its
  inputs (a transformer layer, a residual block): of the block, only its
  inputs stay alive between the forward and the backward pass.

  Args:
    fn: a function of tensors (positional arguments) returning a tensor or
      a nested structure of tensors. It may create variables
      (`tf.compat.v1.get_variable`, `tf.compat.v1.layers`); they are
      created once, in the forward pass, under the names they would have
      without the decorator. Random ops in it (dropout) are replayed
      exactly.

  Returns:
    A function with the signature of `fn`, to call in a `tf.compat.v1`
    graph or inside a `tf.function`.

  Called eagerly, outside any graph, the function runs as it is.

  Raises (when the returned function is called):
    ValueError: the block holds an op that changes state or control flow.
  """
  if not callable(fn):
    raise TypeError(f"recompute: fn must be callable, got {fn!r}.")

  @functools.wraps(fn)
  def recomputed(*args, **kwargs):
    if tf.executing_eagerly():
      # Eagerly (a Keras model called on a batch to build it, or to
      # predict) there is no graph to recompute in.
      return fn(*args, **kwargs)
    args = [_as_tensor(arg, index, fn) for index, arg in enumerate(args)]
    block = _Block(functools.partial(fn, **kwargs) if kwargs else fn,
                   _name(fn))
    block.build(args)
    return tf.custom_gradient(block.outputs)(*args, *block.external)

  return recomputed


def _name(fn):
  return getattr(fn, "__name__", type(fn).__name__)


def _as_tensor(value, index, fn):
  try:
    return tf.convert_to_tensor(value)
  except (TypeError, ValueError):
    raise TypeError(
        f"recompute({_name(fn)}): positional argument {index} must be a "
        f"tensor, got {value!r}; pass other values by keyword.") from None


class _Block:
  """One call of a recomputed function: its ops, what they read from
  outside (`external`), and its gradient."""

  def __init__(self, fn, name):
    self._fn = fn
    self._name = name
    self._args = []
    self._structure = None
    self._outputs = []
    self._ops = []
    self.external = []

  def build(self, args):
    """Runs the function once, as the forward pass."""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    self._structure = self._fn(*args)
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(self._structure)]
    flat, seed = self._replay_random_ops(
        set(graph.get_operations()[before:]), flat)
    self._args = args
    self._outputs = flat
    # The seed is read again, not drawn again.
    self._ops = _ops_between(
        flat, set(graph.get_operations()[before:]) - {seed})
    self._refuse_what_cannot_run_twice()
    self.external = _read_from_outside(self._ops, args)

  def outputs(self, *unused_inputs):
    """For tf.custom_gradient: the outputs built, and their gradient."""
    return tf.nest.pack_sequence_as(self._structure, self._outputs), (
        self.gradient)

  def _replay_random_ops(self, made, flat):
    """Replaces each stateful random op that `flat` depends on by its
    stateless twin, seeded from one seed drawn per run of the block.
    Returns the outputs and the op drawing the seed (None: no random op)."""
    random_ops = [op for op in _ops_between(flat, made)
                  if op.type in _STATELESS]
    if not random_ops:
      return flat, None
    with tf.name_scope(f"{self._name}_seed"):
      seed = tf.random.uniform([2], maxval=_SEED_MAX, dtype=tf.int64)
    replaced = {}
    for index, op in enumerate(random_ops):
      with tf.device(op.device), tf.name_scope(f"{op.name}_stateless"):
        stateless = _STATELESS[op.type](
            op, seed + tf.constant([0, index + 1], tf.int64))
        stateless.set_shape(op.outputs[0].shape)
      tf_private.reroute(op.outputs[0], stateless)
      replaced[op.outputs[0].ref()] = stateless
    return [replaced.get(t.ref(), t) for t in flat], seed.op

  def _refuse_what_cannot_run_twice(self):
    for op in self._ops:
      if op.type in _CONTROL_FLOW:
        raise ValueError(
            f"recompute({self._name}): op {op.name!r} ({op.type}) is control "
            "flow, which cannot be recomputed; keep tf.cond, tf.while_loop "
            "and tf.function calls outside the recomputed function.")
      if op.op_def.is_stateful and op.type not in _REPEATABLE:
        raise ValueError(
            f"recompute({self._name}): op {op.name!r} ({op.type}) changes "
            "state; recomputing it would do that twice. Move it out of the "
            "recomputed function.")

  def gradient(self, *output_gradients, variables=None):
    """The gradient of the block's inputs and of what it reads from outside,
    taken through a second run of its ops that starts when
    `output_gradients` exist. Variables are read through `external`, so
    none is differentiated here by name."""
    output_gradients = [
        tf.zeros_like(out) if grad is None else grad
        for out, grad in zip(self._outputs, output_gradients)]
    with tf.control_dependencies(output_gradients):
      gate = tf.no_op(name="recompute_gate")
    copies = {}
    with tf.name_scope("recompute"):
      for op in self._ops:
        copies[op] = _copy(op, copies, gate)
    recomputed = [_copied(t, copies) for t in self._outputs]
    # Each input is a leaf: an input that depends on another one (a
    # variable's handle read again to make an argument) gets only its own
    # part here; the outer gradient adds the rest.
    inputs = self._args + self.external
    gradients = _grouped(tf.gradients(
        recomputed, inputs, grad_ys=output_gradients, stop_gradients=inputs))
    if variables is None:
      return gradients
    return gradients, [None] * len(variables)


def _grouped(gradients):
  """`gradients`, each available only once all of them are.

  The block's backward ends as one step: the gradient of its inputs, which
  the previous block's recomputation waits for, comes after every weight
  gradient of the block, so that nothing of this block's backward (a weight
  gradient's MatMul reads the block's largest intermediates) is left for an
  executor to run after the previous block has been recomputed. Without
  it the order is the executor's choice, and a one-thread executor may keep
  every block's intermediates alive at once."""
  present = [g for g in gradients if g is not None]
  if len(present) < 2:
    return gradients
  grouped = iter(tf.tuple(present, name="block_gradients"))
  return [None if g is None else next(grouped) for g in gradients]


def _ops_between(outputs, made):
  """The ops of `made` that `outputs` depend on (data or control), in an
  order where each comes after its inputs."""
  order, seen = [], set()
  stack = [(t.op, False) for t in outputs]
  while stack:
    op, expanded = stack.pop()
    if expanded:
      order.append(op)
      continue
    if op in seen or op not in made:
      continue
    seen.add(op)
    stack.append((op, True))
    stack.extend((t.op, False) for t in op.inputs)
    stack.extend((c, False) for c in op.control_inputs)
  return [op for op in order if op.type not in _SOURCES]


def _copied(tensor, copies):
  """`tensor`'s copy, or `tensor` itself when its op is not copied."""
  copy = copies.get(tensor.op)
  return tensor if copy is None else copy.outputs[tensor.value_index]


def _copy(op, copies, gate):
  """A copy of `op` reading the copies of its inputs (`copies`: original op
  -> copy); an op that reads no copy waits for `gate`."""
  inputs = [_copied(t, copies) for t in op.inputs]
  controls = [copies.get(c, c) for c in op.control_inputs]
  if not any(t.op in copies for t in op.inputs):
    controls.append(gate)
  graph = op.graph
  with tf.device(op.device), tf.control_dependencies(controls):
    copy = graph.create_op(
        op.type, inputs, [t.dtype for t in op.outputs],
        name=op.name.replace(":", "_"), attrs=dict(op.node_def.attr),
        op_def=op.op_def)
  for original, made in zip(op.outputs, copy.outputs):
    made.set_shape(original.shape)
  return copy


def _read_from_outside(ops, args):
  """The tensors `ops` read that no op of `ops` makes, other than `args`
  and constants: the variables' handles (or reads), and anything the
  function closed over. Each becomes an input of the custom gradient, so that
  its gradient flows on to what made it."""
  inside = set(ops)
  skip = {t.ref() for t in args}
  external = []
  for op in ops:
    for tensor in op.inputs:
      if (tensor.op not in inside and tensor.ref() not in skip and
          tensor.op.type != "Const"):
        skip.add(tensor.ref())
        external.append(tensor)
  return external
