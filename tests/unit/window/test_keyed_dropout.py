"""estimator_accum.keyed_dropout: dropout whose masks follow the examples'
keys. A window of micro-batches then trains to the weights of the big
batch with dropout on, as plain TensorFlow's big-batch training with the
same masks does; the masks keep 1 - rate, independently; bad arguments
are one line."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.window import keyed_dropout as keyed

EXAMPLES_A_UPDATE = 8
UPDATES = 3
RATE = 0.3


def _mask(shape, rate, offset, site="site", seed=0):
  with tf.Graph().as_default():
    rows = tf.reshape(tf.range(np.prod(shape[:-1])) + offset, shape[:-1])
    dropped = estimator_accum.keyed_dropout(tf.ones(shape), rate, rows,
                                            seed=seed, site=site)
    with tf.compat.v1.Session() as session:
      return session.run(dropped)


def test_masks_keep_one_minus_rate_scaled_and_independent():
  values = _mask([2000, 384], 0.1, 0)
  kept = values != 0
  assert set(np.unique(values)) == {0.0, np.float32(1 / 0.9)}
  assert abs(kept.mean() - 0.9) < 0.002
  # No row or column is special, and neighbours are independent.
  assert np.abs(kept.mean(axis=0) - 0.9).max() < 0.03
  assert np.abs(kept.mean(axis=1) - 0.9).max() < 0.07
  for along in (0, 1):
    both = (~kept & ~np.roll(kept, 1, axis=along)).mean()
    assert abs(both - 0.01) < 0.002, along
  assert abs(_mask([500, 300], 0.5, 0).astype(bool).mean() - 0.5) < 0.01


def test_masks_follow_the_key_the_site_and_the_seed():
  base = _mask([50, 64], 0.3, 0)
  np.testing.assert_array_equal(_mask([50, 64], 0.3, 0), base)
  for other in (_mask([50, 64], 0.3, 1), _mask([50, 64], 0.3, 0, "other"),
                _mask([50, 64], 0.3, 0, seed=1)):
    assert 0.4 < np.mean((other != 0) == (base != 0)) < 0.8
  # A row's mask is its key's, whatever the rows beside it or the width.
  np.testing.assert_array_equal(_mask([10, 64], 0.3, 0), base[:10])
  np.testing.assert_array_equal(_mask([50, 20], 0.3, 0), base[:, :20])
  np.testing.assert_array_equal(_mask([4, 3], 0, 0), np.ones([4, 3]))


@pytest.mark.parametrize(("change", "message"), [
    (dict(rate=1.0), r"dropout rate must be in \[0, 1\), got 1.0"),
    (dict(rate=-0.1), r"dropout rate must be in \[0, 1\), got -0.1"),
    (dict(rate="0.1"), r"dropout rate must be in \[0, 1\), got '0.1'"),
    (dict(keys=lambda: tf.zeros([2])), r"keys must be integers, one a row "
                                       r"of inputs, got float32"),
    (dict(keys=lambda: tf.zeros([2, 3], tf.int32)),
     r"keys must have the shape of inputs without its last axis"),
    (dict(seed="42"), r"dropout seed must be an integer, got '42'"),
])
def test_bad_arguments_are_one_line(change, message):
  with tf.Graph().as_default():
    arguments = dict(inputs=tf.ones([2, 3]), rate=0.1,
                     keys=tf.zeros([2], tf.int64), seed=0, site="x")
    arguments.update({name: value() if callable(value) else value
                      for name, value in change.items()})
    with pytest.raises(ValueError, match=message):
      estimator_accum.keyed_dropout(**arguments)


def _data():
  rng = np.random.RandomState(0)
  count = EXAMPLES_A_UPDATE * UPDATES
  return (rng.normal(size=[count, 5]).astype(np.float32),
          rng.normal(size=[count, 1]).astype(np.float32),
          # Each example's key: its place in the stream.
          np.arange(count, dtype=np.int64))


def _trained(micro_batch, k, keyed_masks=True):
  """The weights after UPDATES updates of EXAMPLES_A_UPDATE examples, as
  micro-batches of `micro_batch` through the accumulating train op (k) or,
  with k=None, plain TensorFlow's minimize on the big batch."""
  features, targets, keys = _data()
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 5])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    key = tf.compat.v1.placeholder(tf.int64, [None])
    rng = np.random.RandomState(1)
    hidden = tf.Variable(rng.normal(size=[5, 16]).astype(np.float32))
    out = tf.Variable(rng.normal(size=[16, 1]).astype(np.float32))
    h = tf.nn.relu(tf.matmul(x, hidden))
    h = (estimator_accum.keyed_dropout(h, RATE, key, seed=7, site="hidden")
         if keyed_masks else tf.nn.dropout(h, rate=RATE, seed=7))
    loss = tf.reduce_mean(tf.square(tf.matmul(h, out) - y))
    optimizer = tf.compat.v1.train.AdamOptimizer(0.05)
    if k is None:
      train_op = optimizer.minimize(loss)
    else:
      train_op = estimator_accum.build_accumulating_train_op(
          loss, optimizer, k, summaries=False)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for start in range(0, len(keys), micro_batch):
        rows = slice(start, start + micro_batch)
        session.run(train_op, {x: features[rows], y: targets[rows],
                               key: keys[rows]})
      return session.run([hidden, out])


def test_a_window_trains_to_the_big_batch_weights_dropout_on():
  big_batch = _trained(EXAMPLES_A_UPDATE, None)
  start = np.random.RandomState(1).normal(size=[5, 16])
  assert not np.allclose(big_batch[0], start, atol=1e-3)
  for micro_batch, k in ((2, 4), (4, 2), (8, 1)):
    for actual, expected in zip(_trained(micro_batch, k), big_batch):
      np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{micro_batch} x {k}")


def test_tf_nn_dropout_masks_follow_the_batch_instead():
  """What the test above rules out: tf.nn.dropout's window of 2 x 4 meets
  other masks than its big batch, and trains to other weights."""
  big_batch = _trained(EXAMPLES_A_UPDATE, None, keyed_masks=False)
  window = _trained(2, 4, keyed_masks=False)
  assert not np.allclose(window[0], big_batch[0], rtol=1e-3, atol=1e-3)


def _masks_and_keys():
  with tf.Graph().as_default():
    keys = tf.range(300, dtype=tf.int64) * 7919 + 2**40 + 5
    masks = estimator_accum.keyed_dropout(tf.ones([300, 97]), 0.1, keys,
                                          seed=42, site="s")
    tokens = keyed.token_keys(keyed.example_keys(keys[:8], 3), 17, 3)
    heads = keyed.per_head(tokens, 4, 3)
    with tf.compat.v1.Session() as session:
      return session.run([masks, tokens, heads])


def test_int64_words_where_a_gpu_is_seen_give_the_same_masks(monkeypatch):
  """Without a GPU the hash's words are uint32; where one is seen, int64
  (kernels for every op there): the same masks and keys, bit for bit."""
  assert keyed.word_dtype() == (
      tf.int64 if tf.config.list_physical_devices("GPU") else tf.uint32)
  monkeypatch.setattr(keyed, "word_dtype", lambda: tf.uint32)
  on_cpu = _masks_and_keys()
  monkeypatch.setattr(keyed, "word_dtype", lambda: tf.int64)
  on_gpu = _masks_and_keys()
  assert on_gpu[1].dtype == np.int64 and on_cpu[1].dtype == np.uint32
  for cpu, gpu in zip(on_cpu, on_gpu):
    np.testing.assert_array_equal(cpu.astype(np.float64),
                                  gpu.astype(np.float64))
