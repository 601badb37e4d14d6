"""The last layer for the pooler only (`BertModel(..., pooled_only=True)`):
it computes each example's first token, whose query attends to every
token. The pooled output and the gradient of every variable equal the full
model's (dropout off), padded or unpadded, one example a row or packed,
kept or recomputed; its last layer's matrix products run on one row an
example."""

import numpy as np
import pytest
import tensorflow as tf

from models.bert import modeling, packing
from tests.unit.models.test_bert_packing import (
  CONFIG,
  SEQ_LENGTH,
  _examples,
  _one_per_row,
)
from tests.unit.models.test_bert_unpadded import shared_model

LENGTHS = [7, 3, 12, 5, 16, 2]


def _rows_with_an_empty_row():
  rows = _one_per_row(_examples(LENGTHS))
  # A row of padding only (a batch filled up to its size): the full
  # unpadded model's last layer is zeros there, and so is its [CLS].
  return {name: np.concatenate([value, np.zeros_like(value[:1])])
          for name, value in rows.items()}


def _full_and_pooled_only(rows, unpadded, recompute=False, packed=None):
  """(full, pooled_only) on shared weights: the pooled output and the
  gradient of a loss on it for every variable."""
  results = []
  with tf.Graph().as_default():
    for pooled_only in (False, True):
      model = shared_model(rows, packed, recompute=recompute,
                           unpadded=unpadded, pooled_only=pooled_only)
      pooled = model.get_pooled_output()
      loss = tf.reduce_sum(tf.sin(pooled) * tf.range(
          1.0, 1.0 + CONFIG.hidden_size))
      variables = tf.compat.v1.trainable_variables()
      gradients = tf.gradients(loss, variables)
      results.append((pooled, dict(zip(
          [v.op.name for v in variables],
          [tf.convert_to_tensor(g) for g in gradients]))))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(results)


def _assert_same(full, pooled_only, example_mask=None):
  pooled, gradients = full
  pooled_p, gradients_p = pooled_only
  assert pooled_p.shape == pooled.shape
  if example_mask is None:
    np.testing.assert_allclose(pooled_p, pooled, rtol=1e-5, atol=1e-6)
  else:  # Packed: the examples a row holds.
    np.testing.assert_allclose(pooled_p[example_mask], pooled[example_mask],
                               rtol=1e-5, atol=1e-6)
  assert sorted(gradients_p) == sorted(gradients)
  largest = max(np.abs(g).max() for g in gradients.values())
  for name, gradient in gradients.items():
    if "attention/self/key/bias" in name:
      # Its gradient is zero (softmax ignores a shift of every score), in
      # float32 rounding of ~1e-12 either way.
      assert np.abs(gradients_p[name]).max() < 1e-6 * largest, name
      continue
    assert np.any(gradient), name
    scale = max(np.abs(gradient).max(), 1e-3 * largest)
    np.testing.assert_allclose(gradients_p[name], gradient, rtol=1e-5,
                               atol=1e-5 * scale, err_msg=name)


@pytest.mark.parametrize("recompute", [False, True],
                         ids=["kept", "recomputed"])
@pytest.mark.parametrize("unpadded", [False, True],
                         ids=["padded", "unpadded"])
def test_pooled_output_and_gradients_equal_the_full_model(unpadded,
                                                          recompute):
  rows = _rows_with_an_empty_row()
  full, pooled_only = _full_and_pooled_only(rows, unpadded, recompute)
  _assert_same(full, pooled_only)


@pytest.mark.parametrize("unpadded", [False, True],
                         ids=["padded", "unpadded"])
def test_packed_rows_equal_the_full_model(unpadded):
  examples = _examples([7, 3, 12, 5, 9, 2, 4])
  packed = packing.pack(examples, SEQ_LENGTH)
  max_examples = max(n for _, n in packed["placement"])
  assert max_examples > 1
  full, pooled_only = _full_and_pooled_only(None, unpadded, packed=packed)
  held = np.zeros(packed["input_ids"].shape[:1] + (max_examples,), bool)
  for row, number in packed["placement"]:
    held[row, number - 1] = True
  _assert_same(full, pooled_only, held)


def test_the_last_layer_runs_on_one_row_an_example():
  """What it saves: the last layer's query, attention output and
  feed-forward products have a row an example; its key and value products
  every real token's row, as every other layer's products."""
  rows = _one_per_row(_examples(LENGTHS))
  with tf.Graph().as_default() as graph:
    modeling.BertModel(
        CONFIG, False, tf.constant(rows["input_ids"]),
        input_mask=tf.constant(rows["input_mask"]), unpadded=True,
        pooled_only=True)
    products = {op.name: op.outputs[0] for op in graph.get_operations()
                if op.type == "MatMul" and "/encoder/" in op.name}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      shapes = session.run({name: tf.shape(t)[0]
                            for name, t in products.items()})
  assert len(shapes) == 6 * CONFIG.num_hidden_layers
  for index in range(CONFIG.num_hidden_layers):
    counts = sorted(count for name, count in shapes.items()
                    if f"/layer_{index}/" in name)
    if index < CONFIG.num_hidden_layers - 1:
      assert counts == [sum(LENGTHS)] * 6, index
    else:  # query, attention output, intermediate, output; key, value
      assert counts == [len(LENGTHS)] * 4 + [sum(LENGTHS)] * 2


def test_every_token_output_is_refused_in_one_line():
  with tf.Graph().as_default():
    model = modeling.BertModel(CONFIG, False, tf.ones([2, 4], tf.int32),
                               pooled_only=True)
    assert model.get_pooled_output().shape.as_list() == [
        2, CONFIG.hidden_size]
    for method in ("get_sequence_output", "get_all_encoder_layers"):
      with pytest.raises(ValueError, match=rf"BertModel.{method}: this model "
                         r"was built with pooled_only=True"):
        getattr(model, method)()


def test_dropout_trains_on_the_first_tokens():
  """With dropout on (training), the model builds and its pooled output
  and gradients are finite."""
  rows = _one_per_row(_examples(LENGTHS))
  config = modeling.BertConfig.from_dict(
      dict(CONFIG.to_dict(), hidden_dropout_prob=0.1,
           attention_probs_dropout_prob=0.1))
  with tf.Graph().as_default():
    model = modeling.BertModel(
        config, True, tf.constant(rows["input_ids"]),
        input_mask=tf.constant(rows["input_mask"]), unpadded=True,
        pooled_only=True)
    loss = tf.reduce_sum(model.get_pooled_output())
    gradients = [tf.convert_to_tensor(g) for g in tf.gradients(
        loss, tf.compat.v1.trainable_variables())]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run([loss, *gradients])
  assert all(np.all(np.isfinite(v)) for v in values)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_pooled_only_that_is_not_a_bool(value):
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=rf"pooled_only must be True or "
                                         rf"False, got {value!r}"):
      modeling.BertModel(CONFIG, False, tf.zeros([2, 4], tf.int32),
                         pooled_only=value)
