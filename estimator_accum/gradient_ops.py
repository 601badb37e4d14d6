"""Helpers for gradients that may be tf.Tensor or tf.IndexedSlices, and the
window's all-reduce (internal to estimator_accum).

Every helper takes either kind and returns the same kind, so the window
handles dense and sparse (embedding) gradients through one path.
"""

import collections

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


def sum_over_replicas(strategy, structure, options):
  """Sums a nest of per-replica tensors (None entries kept) over all replicas,
  in cross-replica context: one batched all-reduce per dtype (one, unless
  the accumulators are not float32), since a pack is concatenated and its
  tensors share a dtype.

  Args:
    strategy: the tf.distribute.Strategy.
    structure: a nest of per-replica values or None.
    options: tf.distribute.experimental.CommunicationOptions or None.

  Returns:
    The same nest, each value the sum over replicas (mirrored).
  """
  flat = tf.nest.flatten(structure)
  by_dtype = collections.defaultdict(list)
  for i, value in enumerate(flat):
    if value is not None:
      by_dtype[strategy.experimental_local_results(value)[0].dtype].append(i)
  for indices in by_dtype.values():
    reduced = strategy.extended.batch_reduce_to(
        tf.distribute.ReduceOp.SUM, [(flat[i], flat[i]) for i in indices],
        options=options)
    for i, value in zip(indices, reduced):
      flat[i] = value
  return tf.nest.pack_sequence_as(structure, flat)
