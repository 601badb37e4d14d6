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


def fixed_row_count(gradient):
  """Pads a tf.IndexedSlices to one row per table row; a Tensor is returned.

  A v1 optimizer all-gathers IndexedSlices across replicas, and TensorFlow's
  graph-mode collectives keep the shape they first saw: a window touching a
  different number of rows than the last one aborts the collective. The
  padding repeats a touched row with zero values; optimizers sum duplicate
  rows before a sparse update, so the update is the same. (A window that
  touched no row at all pads with row 0, which then counts as touched.)
  """
  if not isinstance(gradient, tf.IndexedSlices):
    return gradient
  num_rows = tf.cast(gradient.dense_shape[0], tf.int32)
  padding = num_rows - tf.shape(gradient.indices)[0]
  indices = tf.cast(gradient.indices, tf.int64)
  filler = tf.concat([indices, tf.zeros([1], tf.int64)], 0)[0]
  value_shape = tf.concat([[padding], tf.shape(gradient.values)[1:]], 0)
  return tf.IndexedSlices(
      tf.concat([gradient.values,
                 tf.zeros(value_shape, gradient.values.dtype)], 0),
      tf.concat([indices, tf.fill([padding], filler)], 0),
      gradient.dense_shape)
