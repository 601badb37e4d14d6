"""bfloat16 products, float32 everything else: the window's contract in
bfloat16, on every release.

A model whose forward pass runs in bfloat16 (float32 variables cast in,
the loss float32) hands the window float32 gradients of bfloat16
products; the accumulators stay float32. k bfloat16 micro-batches then land
no further from the float32 big batch than the bfloat16 big batch does:
the only difference is each product rounded to bfloat16 per micro-batch,
not per batch. The float32 path stays exact (tested everywhere else)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support

K, MICRO_BATCH, UPDATES = 4, 8, 4


def _accumulated(optimizer_fn, data, compute_dtype):
  """UPDATES windows of K micro-batches through the library, the forward
  pass in `compute_dtype`; (weights, the accumulators' dtypes)."""
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(0)
    tf.compat.v1.train.get_or_create_global_step()
    inputs = {key: tf.compat.v1.placeholder(tf.as_dtype(value.dtype),
                                            (None,) + value.shape[1:])
              for key, value in data.items()}
    loss = support.model_loss(inputs, inputs["labels"],
                              compute_dtype=compute_dtype)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimizer_fn(), K, summaries=False,
        log_every_n_micro_batches=None)
    state = estimator_accum.get_accumulation_state()
    dtypes = {accumulator.total.dtype.base_dtype
              for accumulator in state.accumulators}
    variables = tf.compat.v1.trainable_variables()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(K * UPDATES):
        rows = slice(step * MICRO_BATCH, (step + 1) * MICRO_BATCH)
        session.run(train_op, {inputs[key]: value[rows]
                               for key, value in data.items()})
      return {v.op.name: session.run(v) for v in variables}, dtypes


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_k_bfloat16_micro_batches_are_as_close_as_the_bfloat16_big_batch(
    optimizer):
  optimizer_fn = support.V1_OPTIMIZERS[optimizer]
  ratios = []
  for seed in range(3):
    data = support.make_data(K * MICRO_BATCH * UPDATES, seed=seed)
    fp32_big = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                       UPDATES)
    bf16_big = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                       UPDATES, compute_dtype=tf.bfloat16)
    bf16_window, dtypes = _accumulated(optimizer_fn, data, tf.bfloat16)
    assert dtypes == {tf.float32}
    assert all(value.dtype == np.float32 for value in bf16_window.values())
    big = support.relative_distance(bf16_big, fp32_big)
    window = support.relative_distance(bf16_window, fp32_big)
    # bfloat16 was used (its 8-bit mantissa moves the weights).
    assert big > 1e-5 and window > 1e-5, (big, window)
    ratios.append(window / big)
  # The window is no further from float32 than the big batch, up to the
  # spread of bfloat16's rounding itself (0.88-1.08 a seed over three data
  # seeds of SGD, momentum and Adam, 2026-12-06).
  assert max(ratios) <= 1.5 and np.mean(ratios) <= 1.15, ratios


def test_the_float32_window_stays_exact():
  optimizer_fn = support.V1_OPTIMIZERS["adam"]
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                     UPDATES)
  weights, _ = _accumulated(optimizer_fn, data, tf.float32)
  support.assert_weights_close(weights, expected, what="float32")
