"""Helpers for gradients that may be tf.Tensor or tf.IndexedSlices
(internal to estimator_accum).

Every helper takes either kind and returns the same kind, so the window
handles dense and sparse (embedding) gradients through one path.
"""

import tensorflow as tf


def scale_gradient(gradient, factor):
  """Multiplies a tf.Tensor or tf.IndexedSlices by a scalar."""
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values * factor, gradient.indices,
                            gradient.dense_shape)
  return gradient * factor


def scale_unless_one(factor, gradients):
  """`gradients` times `factor`, or `gradients` themselves where `factor`
  (a scalar tensor) is 1, with no product and so no copy of the model.

  Args:
    factor: float scalar tensor.
    gradients: list of tf.Tensor or tf.IndexedSlices (each keeps its rows).
  """
  values = [g.values if isinstance(g, tf.IndexedSlices) else g
            for g in gradients]
  values = tf.cond(
      tf.equal(factor, 1.0), lambda: list(values),
      lambda: [v * tf.cast(factor, v.dtype) for v in values],
      name="scale_unless_one")
  return [tf.IndexedSlices(v, g.indices, g.dense_shape)
          if isinstance(g, tf.IndexedSlices) else v
          for g, v in zip(gradients, values)]


def cast_gradient(gradient, dtype):
  """Casts a tf.Tensor or tf.IndexedSlices to `dtype`."""
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(tf.cast(gradient.values, dtype), gradient.indices,
                            gradient.dense_shape)
  return tf.cast(gradient, dtype)


def first_tensor(gradients):
  """The tensor of the first gradient in `gradients` that is not None (a
  table's values), or None: what the micro-batch's gradients are computed
  from can be read from it (its input, its dtypes, its device)."""
  gradient = next((g for g in gradients if g is not None), None)
  return getattr(gradient, "values", gradient)
