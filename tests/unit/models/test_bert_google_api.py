"""google-research/bert's modeling helpers that scripts such as run_squad.py
and run_pretraining.py call, against closed forms and numpy."""

import math

import numpy as np
import pytest
import tensorflow as tf

from models.bert import modeling


def _run(fetches, feed_dict=None):
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    return session.run(fetches, feed_dict)


def test_get_shape_list_static_dynamic_and_rank():
  with tf.Graph().as_default():
    static = tf.zeros([2, 3, 4])
    assert modeling.get_shape_list(static, expected_rank=3) == [2, 3, 4]
    dynamic = tf.compat.v1.placeholder(tf.float32, [None, 5])
    batch, width = modeling.get_shape_list(dynamic, expected_rank=[2, 3])
    assert width == 5 and isinstance(batch, tf.Tensor)
    assert _run(batch, {dynamic: np.zeros((7, 5))}) == 7
    with pytest.raises(ValueError, match=r"tensor seq has rank 3 .*expected "
                                         r"rank 2"):
      modeling.get_shape_list(static, expected_rank=2, name="seq")


def test_get_activation_by_name():
  with tf.Graph().as_default():
    x = tf.constant([1.0, -2.0])
    gelu, gelu_tanh, relu = _run([
        modeling.get_activation(name)(x)
        for name in ("gelu", "GELU_tanh", "relu")])
  erf_gelu = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in (1, -2)]
  tanh_gelu = [0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) *
                                          (v + 0.044715 * v**3)))
               for v in (1, -2)]
  np.testing.assert_allclose(gelu, erf_gelu, rtol=1e-5)
  np.testing.assert_allclose(gelu_tanh, tanh_gelu, rtol=1e-5)
  np.testing.assert_allclose(relu, [1.0, 0.0])
  assert modeling.get_activation("linear") is None
  assert modeling.get_activation("") is None
  assert modeling.get_activation(None) is None
  assert modeling.get_activation(tf.tanh) is tf.tanh
  with pytest.raises(ValueError, match="'swish'"):
    modeling.get_activation("swish")


def test_layer_norm_dropout_and_attention_mask():
  rng = np.random.RandomState(0)
  values = rng.normal(size=(2, 3, 4)).astype(np.float32)
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.int32)
  with tf.Graph().as_default():
    inputs = tf.constant(values)
    normed = modeling.layer_norm(inputs)
    named = modeling.layer_norm_and_dropout(inputs, 0.0, name="output/LN")
    names = sorted(v.op.name for v in tf.compat.v1.global_variables())
    assert names == ["LayerNorm/beta", "LayerNorm/gamma",
                     "output/LN/beta", "output/LN/gamma"]
    assert modeling.dropout(inputs, None) is inputs
    assert modeling.dropout(inputs, 0.0) is inputs
    attention = modeling.create_attention_mask_from_input_mask(
        inputs, tf.constant(mask))
    normed, named, attention = _run([normed, named, attention])
  mean = values.mean(-1, keepdims=True)
  expected = (values - mean) / np.sqrt(values.var(-1, keepdims=True) + 1e-12)
  np.testing.assert_allclose(normed, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(named, expected, rtol=1e-5, atol=1e-6)
  assert attention.shape == (2, 3, 4) and attention.dtype == np.float32
  np.testing.assert_array_equal(attention,
                                np.repeat(mask[:, None, :], 3, axis=1))


def test_bert_config_accepts_what_googles_accepts():
  """Google's BertConfig checks nothing and keeps every key of a dict;
  the head size is checked where attention is built."""
  config = modeling.BertConfig(vocab_size=99, hidden_size=37)
  assert (config.vocab_size, config.hidden_size) == (99, 37)
  loaded = modeling.BertConfig.from_dict(
      {"vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2,
       "model_type": "bert", "pad_token_id": 0})
  assert loaded.model_type == "bert" and loaded.pad_token_id == 0
  assert loaded.intermediate_size == 3072  # the default, as Google's
  with tf.Graph().as_default(), pytest.raises(
      ValueError, match=r"hidden size \(37\) is not a multiple of the number "
                        r"of attention heads \(12\)"):
    modeling.BertModel(config, False, tf.zeros([1, 4], tf.int32))


def test_gelu_and_the_reshape_helpers_as_googles():
  with tf.Graph().as_default():
    x = tf.constant([1.0, -2.0])
    three = tf.reshape(tf.range(24.0), [2, 3, 4])
    matrix = modeling.reshape_to_matrix(three)
    back = modeling.reshape_from_matrix(matrix, [2, 3, 4])
    gelu, matrix, back = _run([modeling.gelu(x), matrix, back])
  tanh_gelu = [0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) *
                                          (v + 0.044715 * v**3)))
               for v in (1, -2)]
  np.testing.assert_allclose(gelu, tanh_gelu, rtol=1e-6, atol=1e-6)
  assert matrix.shape == (6, 4)
  np.testing.assert_array_equal(back, np.arange(24.0).reshape(2, 3, 4))
  with tf.Graph().as_default(), pytest.raises(ValueError, match="rank >= 2"):
    modeling.reshape_to_matrix(tf.zeros([3]))


def test_googles_building_blocks_compute_what_bert_model_does():
  """embedding_lookup, embedding_postprocessor, attention_layer (through
  transformer_model) with Google's signatures, on BertModel's own variables
  (reused by name): the same embedding output and layers."""
  config = modeling.BertConfig(
      vocab_size=30, hidden_size=16, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=24, max_position_embeddings=12,
      type_vocab_size=2)
  rng = np.random.RandomState(0)
  ids = rng.randint(0, 30, size=(3, 7)).astype(np.int32)
  mask = np.ones((3, 7), np.int32)
  mask[1, 5:] = 0
  types = rng.randint(0, 2, size=(3, 7)).astype(np.int32)
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(0)
    model = modeling.BertModel(config, False, tf.constant(ids),
                               tf.constant(mask), tf.constant(types),
                               scope="bert")
    with tf.compat.v1.variable_scope("bert", reuse=True):
      with tf.compat.v1.variable_scope("embeddings"):
        words, table = modeling.embedding_lookup(
            tf.constant(ids), config.vocab_size, config.hidden_size)
        embedded = modeling.embedding_postprocessor(
            words, use_token_type=True, token_type_ids=tf.constant(types),
            token_type_vocab_size=config.type_vocab_size,
            max_position_embeddings=config.max_position_embeddings,
            dropout_prob=0.0)
      with tf.compat.v1.variable_scope("encoder"):
        layers = modeling.transformer_model(
            embedded, modeling.create_attention_mask_from_input_mask(
                tf.constant(ids), tf.constant(mask)),
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
            intermediate_size=config.intermediate_size,
            intermediate_act_fn=modeling.get_activation(config.hidden_act),
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            do_return_all_layers=True)
    assert table is model.get_embedding_table()
    ours, theirs = _run([
        [model.get_embedding_output()] + model.get_all_encoder_layers(),
        [embedded] + layers])
  for index, (want, got) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                               err_msg=f"output {index}")
