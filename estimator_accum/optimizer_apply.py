"""How the window's gradient reaches the optimizer inside the end-of-window
`tf.cond` (internal to estimator_accum).

Optimizers create slots while applying, and under a distribution strategy a
v1 optimizer all-reduces what it is given. Inside the window's branch the
first must happen outside the control flow and the second must not happen
at all: the window has already been all-reduced once.
"""

import tensorflow as tf


def create_outside_control_flow(next_creator, **kwargs):
  """Variable creator that builds variables outside any cond branch.

  Optimizers such as BERT's AdamWeightDecay create their slots with
  `tf.compat.v1.get_variable` inside `apply_gradients`. Called from inside the
  end-of-window `tf.cond`, such a variable would be built in the branch (its
  own function graph under control flow v2); `init_scope` lifts it to the
  outer graph, as TensorFlow's own optimizers do for their slots.
  """
  with tf.init_scope():
    return next_creator(**kwargs)


def reduces_in_distributed_apply(optimizer):
  """Whether `optimizer` is a v1 optimizer that applies through the base
  class's `_distributed_apply` (its first step is the all-reduce); not one
  with its own `apply_gradients`, such as Google's AdamWeightDecay."""
  base = tf.compat.v1.train.Optimizer
  return (isinstance(optimizer, base) and
          type(optimizer).apply_gradients is base.apply_gradients and
          type(optimizer)._distributed_apply is base._distributed_apply)  # noqa: SLF001


class AlreadyReduced:
  """A strategy whose `extended.batch_reduce_to` hands the values back.

  Everything else is the strategy's own: `_distributed_apply` then updates
  each replica's copy of every variable (and the slots) with that replica's
  component of the gradients, which the window's all-reduce made equal.
  """

  def __init__(self, strategy):
    self._strategy = strategy
    self.extended = ExtendedAlreadyReduced(strategy.extended)

  def __getattr__(self, name):
    return getattr(self._strategy, name)


class ExtendedAlreadyReduced:

  def __init__(self, extended):
    self._extended = extended

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
    del reduce_op, options
    return [value for value, _ in value_destination_pairs]

  def __getattr__(self, name):
    return getattr(self._extended, name)
