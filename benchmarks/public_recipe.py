"""The public Estimator recipe for gradient accumulation, written here as the
baseline (see ANCHORS: the BERT-on-Yelp and MNIST multi-worker snippets).

Accumulators are plain variables updated with `assign_add` every
micro-batch (SUM-aggregated so that they run under a strategy at all),
`tf.cond(global_step % k == 0)` applies `accumulator / k` inside the cond,
and `global_step` is incremented beside it every micro-batch. Under a
strategy it needs control flow v1 (`tf.compat.v1.disable_control_flow_v2()`):
with v2 the optimizer's merge_call inside the cond raises. Kept as published,
faults included: the first update comes after one micro-batch, and
IndexedSlices are densified every micro-batch.
"""

import tensorflow as tf


def recipe_train_op(loss, optimizer, k):
  global_step = tf.compat.v1.train.get_or_create_global_step()
  grads_and_vars = [(g, v) for g, v in optimizer.compute_gradients(loss)
                    if g is not None]
  accumulators = [
      tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                  name=v.op.name.replace("/", "_") + "_accum",
                  aggregation=tf.VariableAggregation.SUM)
      for _, v in grads_and_vars]
  accumulate = [a.assign_add(tf.convert_to_tensor(g))
                for a, (g, _) in zip(accumulators, grads_and_vars)]

  def apply():
    with tf.control_dependencies(accumulate):
      applied = optimizer.apply_gradients(
          [(a / k, v) for a, (_, v) in zip(accumulators, grads_and_vars)])
    with tf.control_dependencies([applied]):
      return tf.group(*[a.assign(tf.zeros_like(a)) for a in accumulators])

  with tf.control_dependencies(accumulate):
    update = tf.cond(tf.equal(global_step % k, 0), apply, tf.no_op)
  return tf.group(update, global_step.assign_add(1))
