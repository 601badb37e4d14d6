"""A stack of tanh layers trained through the window, for the tests of the
window's apply (its order, its fusion): one variable a layer, each its own
update."""

import numpy as np
import tensorflow as tf

import estimator_accum

WIDTHS = (6, 5, 4, 3)


def train_op(optimizer, widths=WIDTHS, rows=8, **options):
  """The accumulating train op (k=2, clip 1.0) of the stack's squared
  output on fixed inputs; `options` are the window's."""
  h = tf.constant(np.random.RandomState(0).randn(rows, widths[0]), tf.float32)
  for index, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
    h = tf.tanh(tf.matmul(h, tf.compat.v1.get_variable(
        f"kernel_{index}", initializer=tf.constant(
            initial_kernel(index, width_in, width_out), tf.float32))))
  tf.compat.v1.train.get_or_create_global_step()
  return estimator_accum.build_accumulating_train_op(
      tf.reduce_sum(tf.square(h)), optimizer, 2, clip_norm=1.0,
      log_every_n_micro_batches=None, **options)


def initial_kernel(index, width_in, width_out):
  return np.random.RandomState(index).randn(width_in, width_out) * 0.5


def trained_weights(optimizer_fn, **options):
  """{variable name: value} after 6 micro-batches (3 updates)."""
  with tf.Graph().as_default():
    op = train_op(optimizer_fn(), **options)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(op)
      return session.run({v.op.name: v
                          for v in tf.compat.v1.trainable_variables()})
