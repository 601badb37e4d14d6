"""One micro-batch, as every front door hands it in: checked once.

`build_accumulating_train_op`, `AccumulatingOptimizer` (its `minimize` and
`apply_gradients`) and `AccumulatingKerasOptimizer` (in a graph or a
tf.function) each make a `MicroBatch` where they are given it, with
`of_loss` or `of_gradients`, and hand it to the one builder,
`train_op.accumulating_train_op`, which checks none of it again.
"""

import dataclasses

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.window import trained_checks
from estimator_accum.window.gradient_ops import first_tensor, scale_gradient


@dataclasses.dataclass(frozen=True)
class MicroBatch:
  """One micro-batch's loss, or its gradients, checked.

  Attributes:
    loss: the scalar floating-point loss, or None when gradients are given.
    grads_and_vars: [(gradient or None, variable)], or None for a loss.
    var_list: the variables to train (of a loss), or None for all.
    num_examples: a scalar tensor, the micro-batch's examples, or None.
    scaled_by_caller: the gradients given come from a loss the caller
      scaled with the window's loss scale and were unscaled by the caller
      (Keras's `get_scaled_loss`): the window only skips and moves the
      scale.
  """

  loss: object = None
  grads_and_vars: object = None
  var_list: object = None
  num_examples: object = None
  scaled_by_caller: bool = False

  @property
  def source(self):
    """What the micro-batch is computed from, a tensor of it: its loss, or
    its first gradient (its input pipeline, its device)."""
    if self.loss is not None:
      return self.loss
    return first_tensor(g for g, _ in self.grads_and_vars)

  def times(self, factor):
    """This micro-batch with its loss (or gradients) multiplied by the
    Python number `factor` (a Keras optimizer's callers scale for a sum
    over replicas)."""
    if factor == 1:
      return self
    if self.loss is not None:
      return dataclasses.replace(
          self, loss=self.loss * tf.cast(factor, self.loss.dtype))
    return dataclasses.replace(self, grads_and_vars=[
        (None if g is None else scale_gradient(g, tf.cast(factor, g.dtype)),
         v) for g, v in self.grads_and_vars])

  def gradients(self, scaler, options):
    """[(gradient, variable)] of the micro-batch, without the Nones: its
    loss's (scaled by `scaler`, if any; `options`, tf.gradients arguments),
    or those given.

    Raises:
      ValueError: no variable has a gradient.
    """
    if self.loss is None:
      trained = [(g, v) for g, v in self.grads_and_vars if g is not None]
      if not trained:
        raise ValueError(
            f"grads_and_vars has no gradient (all {len(self.grads_and_vars)} "
            "are None): the loss does not depend on any of the variables.")
      return trained
    named = "variables in var_list"
    var_list = self.var_list
    if var_list is None:
      named, var_list = "trainable variables", trainable_variables(self.loss)
    loss = _scalar_when_run(self.loss)
    scaled_loss = loss if scaler is None else scaler.scale_loss(loss)
    gradients = tf.compat.v1.gradients(scaled_loss, var_list, **options)
    trained = [(g, v) for g, v in zip(gradients, var_list) if g is not None]
    if not trained:
      raise ValueError(
          f"loss {loss.name} has no gradient with respect to any of the "
          f"{len(var_list)} {named}; check that the loss depends on them "
          "(var_list, stop_gradient, integer casts).")
    return trained


def of_loss(loss, var_list=None, num_examples=None):
  """The `MicroBatch` of `loss`, checked: TypeError or ValueError naming
  the argument and the value."""
  _checks.check_loss(loss)
  return MicroBatch(loss=loss, var_list=trained_checks.check_var_list(var_list),
                    num_examples=trained_checks.check_num_examples(num_examples))


def of_gradients(grads_and_vars, num_examples=None, scaled_by_caller=False):
  """The `MicroBatch` of one micro-batch's `grads_and_vars`, checked."""
  return MicroBatch(
      grads_and_vars=trained_checks.check_grads_and_vars(grads_and_vars),
      num_examples=trained_checks.check_num_examples(num_examples),
      scaled_by_caller=scaled_by_caller)


def trainable_variables(loss):
  """The graph's trainable variables, once each; ValueError naming `loss`
  if there are none."""
  var_list = (tf.compat.v1.trainable_variables() + tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
  var_list = list({id(v): v for v in var_list}.values())
  if not var_list:
    raise ValueError(
        f"loss {loss.name} cannot be trained: the graph has no trainable "
        "variables.")
  return var_list


def _scalar_when_run(loss):
  """`loss`, checked to be a scalar when it runs if its rank is unknown
  until then: tf.gradients would silently differentiate a non-scalar
  loss's sum."""
  if loss.shape.rank is not None:
    return loss
  check = tf.debugging.assert_rank(
      loss, 0, message=f"loss {loss.name} must be a scalar (rank 0); "
      "reduce it first, e.g. tf.reduce_mean(per_example_loss).")
  with tf.control_dependencies([check]):
    return tf.identity(loss)
