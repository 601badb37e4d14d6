"""The library's door to TensorFlow's private graph API, one function each.

Written for TensorFlow 2.15. Each function says which private name it uses
and why no public API serves; `tests/test_tf_private.py` runs each against
the installed TensorFlow, so that an upgrade that moves a name fails there,
in one place, and not deep inside training.
"""



def reroute(old, new):
  """Makes every consumer of the tensor `old` read `new` instead.

  `tf.Operation._update_input` (TensorFlow 2.15): ops are immutable through
  the public API, and a random op made by the user's own code (dropout's
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

  `tf.Operation._add_control_inputs` (TensorFlow 2.15): control inputs are
  otherwise given only when an op is made, and the window's gates have to
  be made before the optimizer builds the updates they wait for.

  Args:
    op: tf.Operation.
    control_inputs: list of tf.Operation in `op`'s graph.
  """
  if control_inputs:
    op._add_control_inputs(control_inputs)  # noqa: SLF001


def control_flow_context(op):
  """The control-flow (v1) context `op` was made in, None outside any.

  `tf.Operation._get_control_flow_context` (TensorFlow 2.15): control flow
  v1 keeps it on the op only. An op made inside a `tf.compat.v1.cond`
  branch must not wait for an op outside it, nor an op outside for one
  inside (a variable's initializer for an update)."""
  return op._get_control_flow_context()  # noqa: SLF001
