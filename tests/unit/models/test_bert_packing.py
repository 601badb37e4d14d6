"""Packed rows (models/bert/packing.py): several examples in one row are
the model of one example per row. Each example's outputs, packed, equal
its outputs alone in a padded row (dropout off), token for token and for
its [CLS]."""

import numpy as np
import pytest
import tensorflow as tf

from models.bert import modeling, packing

SEQ_LENGTH = 16
CONFIG = modeling.BertConfig(vocab_size=40, hidden_size=16,
                             num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32,
                             max_position_embeddings=SEQ_LENGTH)


def _examples(lengths, seed=0):
  """(input_ids, segment_ids) of [CLS] a [SEP] b [SEP]-shaped examples."""
  rng = np.random.RandomState(seed)
  examples = []
  for length in lengths:
    ids = [1, *rng.randint(5, CONFIG.vocab_size, length - 2), 2]
    second = length // 2
    segments = [0] * second + [1] * (length - second)
    examples.append((ids, segments))
  return examples


def _outputs(model):
  return model.get_sequence_output(), model.get_pooled_output()


def _one_per_row_and_packed(examples):
  """Both models on shared weights: (sequence, pooled) of one example per
  padded row, and (sequence, pooled, example mask) of the packed rows."""
  packed = packing.pack(examples, SEQ_LENGTH)
  single = {name: np.zeros([len(examples), SEQ_LENGTH], np.int32)
            for name in ("input_ids", "segment_ids", "input_mask")}
  for row, (ids, segments) in enumerate(examples):
    single["input_ids"][row, :len(ids)] = ids
    single["segment_ids"][row, :len(ids)] = segments
    single["input_mask"][row, :len(ids)] = 1
  max_examples = max(number for _, number in packed["placement"])
  with tf.Graph().as_default():
    with tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
      alone = modeling.BertModel(
          CONFIG, False, tf.constant(single["input_ids"]),
          input_mask=tf.constant(single["input_mask"]),
          token_type_ids=tf.constant(single["segment_ids"]), scope="bert")
      together = modeling.BertModel(
          CONFIG, False, tf.constant(packed["input_ids"]),
          token_type_ids=tf.constant(packed["segment_ids"]), scope="bert",
          example_ids=tf.constant(packed["example_ids"]),
          max_examples=max_examples)
    assert len(tf.compat.v1.trainable_variables()) == len(
        {v.name for v in tf.compat.v1.trainable_variables()})
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      got = session.run([_outputs(alone), _outputs(together),
                         together.get_example_mask()])
  return got, packed


@pytest.mark.parametrize("lengths", [[7, 3, 12, 5, 9], [16, 2, 2, 8, 8]])
def test_each_packed_example_equals_it_alone(lengths):
  examples = _examples(lengths)
  ((sequence, pooled), (packed_sequence, packed_pooled), mask), packed = (
      _one_per_row_and_packed(examples))
  assert packed_sequence.shape[0] < len(examples)  # fewer rows
  starts = {}
  for index, ((ids, _), (row, number)) in enumerate(
      zip(examples, packed["placement"])):
    start = starts.get(row, 0)
    starts[row] = start + len(ids)
    np.testing.assert_allclose(
        packed_sequence[row, start:start + len(ids)],
        sequence[index, :len(ids)], rtol=1e-5, atol=1e-6,
        err_msg=f"example {index}'s tokens")
    np.testing.assert_allclose(packed_pooled[row, number - 1], pooled[index],
                               rtol=1e-5, atol=1e-6,
                               err_msg=f"example {index}'s [CLS]")
    assert mask[row, number - 1]
  assert mask.sum() == len(examples)


def test_positions_restart_with_each_example():
  example_ids = np.array([[1, 1, 1, 2, 2, 3, 0, 0]], np.int32)
  with tf.Graph().as_default():
    positions = packing.position_ids(tf.constant(example_ids))
    starts, held = packing.first_tokens(tf.constant(example_ids), 4)
    bias = packing.attention_bias(tf.constant(example_ids))
    with tf.compat.v1.Session() as session:
      positions, starts, held, bias = session.run(
          [positions, starts, held, bias])
  np.testing.assert_array_equal(positions[0, :6], [0, 1, 2, 0, 1, 0])
  np.testing.assert_array_equal(starts[0, :3], [0, 3, 5])
  np.testing.assert_array_equal(held[0], [True, True, True, False])
  allowed = bias[0, 0] == 0
  expected = np.zeros((8, 8), bool)
  expected[:3, :3] = expected[3:5, 3:5] = expected[5, 5] = True
  np.testing.assert_array_equal(allowed, expected)


def test_pack_refuses_what_does_not_fit():
  with pytest.raises(ValueError, match="example 1 has 17 tokens, above "
                                       "seq_length=16"):
    packing.pack(_examples([3, 17]), SEQ_LENGTH)
  with pytest.raises(ValueError, match="need 2 rows of 16 tokens, more than "
                                       "rows=1"):
    packing.pack(_examples([9, 9]), SEQ_LENGTH, rows=1)


def test_example_ids_need_max_examples():
  with tf.Graph().as_default():
    ids = tf.ones([1, 4], tf.int32)
    with pytest.raises(ValueError, match="example_ids and max_examples go "
                                         "together"):
      modeling.BertModel(CONFIG, False, ids, example_ids=ids)
