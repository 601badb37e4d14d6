"""Optimizers with an `apply_gradients` of their own, as users bring them:
google-research/bert's AdamWeightDecayOptimizer and a subclass that calls the
base class's.

Google's creates its slots with `tf.compat.v1.get_variable` inside
`apply_gradients`, ignores `global_step`, returns a `tf.group` of
assignments and never merges across replicas (each replica updates its own
copy). The project's own BERT optimizer lives in models/bert; these stay
independent of it.
"""

import re

import tensorflow as tf


class GoogleStyleAdamWeightDecay(tf.compat.v1.train.Optimizer):
  """Adam with decoupled weight decay, no bias correction (as in BERT)."""

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               name="AdamWeightDecayOptimizer"):
    super().__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    del global_step  # Ignored, as in google-research/bert.
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None or param is None:
        continue
      param_name = re.match("^(.*):\\d+$", param.name).group(1)
      m = tf.compat.v1.get_variable(
          name=param_name + "/adam_m", shape=param.shape.as_list(),
          dtype=tf.float32, trainable=False,
          initializer=tf.compat.v1.zeros_initializer())
      v = tf.compat.v1.get_variable(
          name=param_name + "/adam_v", shape=param.shape.as_list(),
          dtype=tf.float32, trainable=False,
          initializer=tf.compat.v1.zeros_initializer())
      grad = tf.convert_to_tensor(grad)
      next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
      next_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(grad)
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      if self._do_use_weight_decay(param_name):
        update += self.weight_decay_rate * param
      next_param = param - self.learning_rate * update
      assignments.extend(
          [param.assign(next_param), m.assign(next_m), v.assign(next_v)])
    return tf.group(*assignments, name=name)

  def _do_use_weight_decay(self, param_name):
    if not self.weight_decay_rate:
      return False
    for pattern in self.exclude_from_weight_decay or []:
      if re.search(pattern, param_name) is not None:
        return False
    return True


class MomentumClippingEachGradient(tf.compat.v1.train.MomentumOptimizer):
  """A user's subclass with an `apply_gradients` of its own that transforms
  the gradients (clips each by its norm, a nonlinear step) and then calls the
  base class's, which all-reduces under a strategy. Handed a share of the
  window per replica instead of the window, it would clip the shares."""

  def __init__(self, learning_rate, momentum, clip_each):
    super().__init__(learning_rate, momentum)
    self._clip_each = clip_each

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    clipped = [(tf.clip_by_norm(tf.convert_to_tensor(g), self._clip_each), v)
               for g, v in grads_and_vars if g is not None]
    return super().apply_gradients(clipped, global_step, name)
