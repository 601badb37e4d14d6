"""BertModel(product_type=tf.bfloat16): the dense products take bfloat16
operands, everything else float32. Every trained variable gets a float32 gradient,
close to float32's at bfloat16's precision, on every layout the main job
trains with (padded, unpadded with the native attention, the last layer
for [CLS] only). With `window_copies` the kernels' bfloat16 operands come
from copies made once a window, and training is the casts' bit for bit."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support
from models.bert import modeling
from tests.helpers import native_kernels


@pytest.mark.parametrize("layout", [
    {}, dict(unpadded=True), dict(unpadded=True, pooled_only=True)])
def test_bfloat16_products_give_float32_gradients_close_to_float32s(layout):
  expected, _ = native_kernels.tiny_bert(**layout)
  actual, types = native_kernels.tiny_bert(product_type=tf.bfloat16,
                                           **layout)
  assert len(actual) == len(expected)
  assert all(gradient.dtype == np.float32 for gradient in actual)
  # bfloat16's 8-bit mantissa: about 2**-8 relative per product. Some
  # gradients are zero but for rounding (the key's bias): each tensor is
  # held to the scale of all of them.
  every, reference = (np.concatenate([g.ravel() for g in gradients])
                      for gradients in (actual, expected))
  assert 0 < support.relative_distance([every], [reference]) < 0.02
  scale = np.abs(reference).max()
  for gradient, one in zip(actual, expected):
    np.testing.assert_allclose(gradient, one, rtol=0.05, atol=0.02 * scale)
  assert "Cast" in types


def _trained_bert(window_copies, layout):
  """A tiny BERT's weights after 2 windows of k=2 micro-batches through
  the library, bfloat16 products, the kernels' operands cast or copied
  once a window (`window_copies`); the local variables' names."""
  config = modeling.BertConfig(vocab_size=50, hidden_size=16,
                               num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=24)
  rng = np.random.RandomState(0)
  ids = rng.randint(0, 50, [4, 3, 9]).astype(np.int32)
  masks = np.ones([4, 3, 9], np.int32)
  masks[:, 1, 6:] = 0
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    tf.compat.v1.train.get_or_create_global_step()
    step = tf.compat.v1.placeholder(tf.int32, [])
    model = modeling.BertModel(
        config, True, tf.gather(tf.constant(ids), step),
        tf.gather(tf.constant(masks), step), product_type=tf.bfloat16,
        window_copies=window_copies, **layout)
    loss = tf.reduce_sum(tf.square(model.get_pooled_output()))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(0.01), 2, summaries=False,
        log_every_n_micro_batches=None)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tf.compat.v1.local_variables_initializer())
      for micro_batch in range(4):
        session.run(train_op, {step: micro_batch})
      return ({v.op.name: session.run(v)
               for v in tf.compat.v1.trainable_variables()},
              [v.op.name for v in tf.compat.v1.local_variables()])


@pytest.mark.parametrize("layout", [{}, dict(unpadded=True)])
def test_window_copies_train_as_the_casts_bit_for_bit(layout):
  native_kernels.loaded()
  expected, plain = _trained_bert(False, layout)
  actual, local = _trained_bert(True, layout)
  copies = sorted(set(local) - set(plain))
  # Every layer's six kernels and the pooler's.
  assert len(copies) == 2 * 6 + 1, copies
  assert all(name.endswith("/kernel/bfloat16_copy") for name in copies)
  support.assert_weights_identical(actual, expected, f"layout {layout}")
