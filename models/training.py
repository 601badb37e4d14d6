"""The training half of the examples' model_fns, with or without
accumulation."""

import tensorflow as tf

import estimator_accum


def train_spec(loss, optimizer, params, log_every=200):
  """EstimatorSpec for TRAIN: accumulation when params["k"] > 1, else plain
  `optimizer.minimize` (so the examples can compare the two)."""
  k = params.get("k", 1)
  hooks = []
  if k > 1:
    train_op = estimator_accum.build_accumulating_train_op(loss, optimizer, k)
    hooks.append(estimator_accum.AccumulationLoggingHook(
        every_n_micro_batches=log_every,
        micro_batch_size=params.get("micro_batch_size")))
    # A NaN micro-batch costs its window, not the run; under
    # MultiWorkerMirroredStrategy each worker reports its own loss.
    loss = estimator_accum.reportable_loss(loss)
  else:
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=loss,
                                    train_op=train_op, training_hooks=hooks)
