"""Keyed dropout in BERT (`BertModel(..., dropout_keys=...)`, `estimator_accum.
keyed_dropout`): each element's mask is a hash of the example's key, its
token's position, the site and the column, so an example meets the same
masks in any micro-batch, padded or not, sorted or not, with the last
layer whole or for [CLS] only: the outputs and the gradients of a window's
examples are the same whichever way it is split, dropout on."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.window import keyed_dropout
from harness import support
from models.bert import modeling
from tests.unit.models.test_bert_packing import CONFIG, _examples, _one_per_row

LENGTHS = [7, 3, 12, 5, 16, 2]
KEYS = [101, 7, 55, 3, 900, 12]


def test_bad_keys_are_refused():
  """(The masks themselves: tests/unit/window/test_keyed_dropout.py.)"""
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=r"dropout keys must be integers of "
                                         r"shape \[batch\], got float32"):
      keyed_dropout.example_keys(tf.zeros([3]), 0)
    with pytest.raises(ValueError, match=r"dropout_keys with packed rows"):
      modeling.BertModel(CONFIG, True, tf.ones([2, 4], tf.int32),
                         example_ids=tf.ones([2, 4], tf.int32), max_examples=1,
                         dropout_keys=tf.constant([1, 2]))


def _batch(indices, trim):
  rows = _one_per_row(_examples(LENGTHS))
  rows = {name: value[indices] for name, value in rows.items()}
  if trim:
    length = int(rows["input_mask"].sum(axis=1).max())
    rows = {name: value[:, :length] for name, value in rows.items()}
  return rows


def _pooled_and_gradients(splits, keyed=True, **options):
  """Each example's pooled output (training: dropout on) and the gradient
  of a loss summed over every example, the examples split into batches
  `splits` (lists of indices), each trimmed to its longest example, on
  shared weights."""
  with tf.Graph().as_default():
    pooled, loss = {}, 0.0
    for indices in splits:
      rows = _batch(indices, trim=True)
      with tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
        model = modeling.BertModel(
            CONFIG, True, tf.constant(rows["input_ids"]),
            input_mask=tf.constant(rows["input_mask"]),
            token_type_ids=tf.constant(rows["segment_ids"]), scope="bert",
            dropout_keys=(tf.constant([KEYS[i] for i in indices])
                          if keyed else None), dropout_seed=5, **options)
      output = model.get_pooled_output()
      loss += tf.reduce_sum(tf.sin(output))
      for row, index in enumerate(indices):
        pooled[index] = output[row]
    variables = tf.compat.v1.trainable_variables()
    gradients = dict(zip([v.op.name for v in variables],
                         tf.gradients(loss, variables)))
    with tf.compat.v1.Session() as session:
      _load_weights(session, variables)
      return session.run(([pooled[i] for i in range(len(LENGTHS))],
                          {n: tf.convert_to_tensor(g)
                           for n, g in gradients.items()}))


def _load_weights(session, variables):
  """The same weights in every graph: drawn from each variable's name."""
  session.run(tf.compat.v1.global_variables_initializer())
  values = {}
  for variable in variables:
    rng = np.random.RandomState(sum(map(ord, variable.op.name)))
    values[variable] = (
        rng.normal(0, 0.2, variable.shape).astype(np.float32) +
        (1.0 if variable.op.name.endswith("gamma") else 0.0))
  support.load_variables(session, values)


WHOLE = [list(range(len(LENGTHS)))]
# Sorted by length, then cut in two and in three, as sorted windows are.
SORTED = sorted(range(len(LENGTHS)), key=LENGTHS.__getitem__)
HALVES = [SORTED[:3], SORTED[3:]]
THIRDS = [SORTED[:2], SORTED[2:4], SORTED[4:]]


@functools.cache
def _whole():
  return _pooled_and_gradients(WHOLE)


@pytest.mark.parametrize(("splits", "options"), [
    (HALVES, {}), (THIRDS, {"unpadded": True}),
    (HALVES, {"unpadded": True, "pooled_only": True}),
    (THIRDS, {"recompute": True})],
    ids=["padded", "unpadded", "pooled_only", "recomputed"])
def test_every_split_gives_the_same_outputs_and_gradients(splits, options):
  whole, whole_gradients = _whole()
  assert all(np.any(g) for g in whole_gradients.values())
  pooled, gradients = _pooled_and_gradients(splits, **options)
  np.testing.assert_allclose(pooled, whole, rtol=1e-5, atol=1e-6)
  largest = max(np.abs(g).max() for g in whole_gradients.values())
  for name, gradient in whole_gradients.items():
    if name.endswith("key/bias"):
      # Softmax ignores what adds to every key: zero, in rounding.
      assert np.abs(gradients[name]).max() < 1e-5 * largest, name
      continue
    scale = max(np.abs(gradient).max(), 1e-3 * largest)
    np.testing.assert_allclose(gradients[name], gradient, rtol=1e-5,
                               atol=1e-5 * scale, err_msg=name)


def test_dropout_is_on_and_tf_dropout_differs_by_split():
  """What the test above rules out: with tf.nn.dropout the same examples
  meet other masks in another split; and keyed dropout does drop (the
  outputs are not the model's without dropout)."""
  whole, _ = _pooled_and_gradients(WHOLE, keyed=False)
  halves, _ = _pooled_and_gradients(HALVES, keyed=False)
  assert not np.allclose(whole, halves, atol=1e-3)
  keyed, _ = _whole()
  with tf.Graph().as_default():
    rows = _batch(WHOLE[0], trim=True)
    model = modeling.BertModel(
        CONFIG, False, tf.constant(rows["input_ids"]),
        input_mask=tf.constant(rows["input_mask"]),
        token_type_ids=tf.constant(rows["segment_ids"]), scope="bert")
    with tf.compat.v1.Session() as session:
      _load_weights(session, tf.compat.v1.trainable_variables())
      plain = session.run(model.get_pooled_output())
  assert not np.allclose(keyed, plain, atol=1e-3)
