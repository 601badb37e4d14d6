"""Keras's LossScaleOptimizer interface, served by `AccumulatingKerasOptimizer`.

Keras's `compile` wraps the optimizer of a mixed_float16 model in a
`LossScaleOptimizer`, unless it is one already. That wrapper decides on
every call of `apply_gradients`: it all-reduces each micro-batch's
gradients, skips a micro-batch that overflowed on its own and moves the
loss scale every micro-batch. The window must decide once per window
instead: skip the whole window when any of its micro-batches overflowed,
move the scale once, all-reduce once. So the accumulating wrapper is a
Keras loss-scale optimizer itself (it implements the interface
`tf.keras.mixed_precision.LossScaleOptimizer` declares), and `compile`
leaves it as it is; its `loss_scale` option ("auto": dynamic for a
mixed_float16 model, Keras's own settings) is the window's.

A custom `train_step` scales and unscales as Keras documents it:

```python
with tf.GradientTape() as tape:
  loss = self.compiled_loss(y, self(x, training=True))
  scaled = self.optimizer.get_scaled_loss(loss)
gradients = self.optimizer.get_unscaled_gradients(
    tape.gradient(scaled, self.trainable_variables))
self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
```
"""

import tensorflow as tf

from estimator_accum.window.gradient_ops import first_tensor, scale_gradient

__all__ = ["KerasLossScaling", "LossScaleOptimizer"]

LossScaleOptimizer = tf.keras.mixed_precision.LossScaleOptimizer


class MadeAsWritten(type(LossScaleOptimizer)):
  """Makes a class that implements the interface as any class is made: the
  metaclass of Keras's LossScaleOptimizer would make one of Keras's own
  loss-scale optimizers instead."""

  def __call__(cls, *args, **kwargs):
    return type.__call__(cls, *args, **kwargs)


class KerasLossScaling(LossScaleOptimizer, metaclass=MadeAsWritten):
  """The LossScaleOptimizer interface over the wrapper's window
  (`self._window`, a `WrapperWindow`)."""

  @property
  def dynamic(self):
    """Whether the window's loss scale is dynamic."""
    config = self._window.loss_scale_config()
    return bool(config is not None and config.dynamic)

  @property
  def loss_scale(self):
    """The window's loss scale now, a float32 scalar tensor (1 when the
    loss is not scaled)."""
    made = self._window.loss_scale_variables()
    if made:
      return tf.convert_to_tensor(made[0])
    config = self._window.loss_scale_config()
    return tf.constant(1.0 if config is None else config.initial, tf.float32)

  @property
  def dynamic_counter(self):
    """The windows applied in a row since the scale last moved (None unless
    dynamic, or before the window is built)."""
    made = self._window.loss_scale_variables()
    return made[1] if len(made) > 1 else None

  @property
  def initial_scale(self):
    """The scale the window starts with (None: the loss is not scaled)."""
    config = self._window.loss_scale_config()
    return None if config is None else config.initial

  @property
  def dynamic_growth_steps(self):
    """Windows applied in a row before a dynamic scale grows, else None."""
    config = self._window.loss_scale_config()
    return config.increment_period if self.dynamic else None

  @property
  def inner_optimizer(self):
    """The optimizer applied once per window."""
    return self._window.inner_optimizer()

  def get_scaled_loss(self, loss):
    """`loss` (a tensor, or a callable returning one) times the window's
    loss scale, inside the tf.function the window is built in."""
    if callable(loss):
      return lambda: self.get_scaled_loss(loss())
    scaler = self._window.loss_scaler(loss)
    return loss if scaler is None else scaler.scale_loss(loss)

  def get_unscaled_gradients(self, grads):
    """`grads` (tensors, tf.IndexedSlices or None) divided by the window's
    loss scale."""
    grads = list(grads)
    scaler = self._window.loss_scaler(first_tensor(grads))
    if scaler is None:
      return grads
    inverse = scaler.inverse()
    return [None if g is None else scale_gradient(g, tf.cast(inverse, g.dtype))
            for g in grads]
