"""BERT with recomputed transformer layers (`BertModel(..., recompute=True)`,
`transformer_model(..., recompute=True)`): the same variables and, dropout
off, the same gradients (1e-6); dropout on, the gradient of the forward
that ran (a directional derivative of the very same forward, its seeds
fed)."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from models.bert import modeling

CONFIG = modeling.BertConfig(
    vocab_size=30, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=16)
BATCH, LENGTH = 3, 8


def _inputs():
  rng = np.random.RandomState(0)
  ids = tf.constant(rng.randint(0, CONFIG.vocab_size, (BATCH, LENGTH)),
                    tf.int32)
  mask = tf.constant(np.array([[1] * LENGTH, [1] * 5 + [0] * 3,
                               [1] * 7 + [0]]), tf.int32)
  return ids, mask


def _loss(model):
  target = tf.constant(np.random.RandomState(1).randn(BATCH, LENGTH, 16),
                       tf.float32)
  return tf.reduce_mean(tf.square(model.get_sequence_output() - target)) + (
      tf.reduce_sum(model.get_pooled_output()))


def test_recompute_keeps_the_variables_and_the_gradient():
  graph = tf.Graph()
  with graph.as_default():
    ids, mask = _inputs()
    gradients, names = {}, {}
    for recompute in (False, True):
      scope = f"run_{int(recompute)}"
      with tf.compat.v1.variable_scope(scope):
        model = modeling.BertModel(CONFIG, False, ids, mask,
                                   recompute=recompute)
      variables = tf.compat.v1.trainable_variables(scope)
      names[recompute] = [v.name.split("/", 1)[1] for v in variables]
      gradients[recompute] = [tf.convert_to_tensor(g) for g in tf.gradients(
          _loss(model), variables)]
    assert names[True] == names[False]
    assert len(names[True]) == 5 + 16 * 3 + 2
    plain = tf.compat.v1.trainable_variables("run_0")
    recomputed = tf.compat.v1.trainable_variables("run_1")
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      support.load_variables(session, dict(zip(recomputed,
                                               session.run(plain))))
      expected, actual = session.run([gradients[False], gradients[True]])
  for name, want, got in zip(names[True], expected, actual):
    assert np.abs(want).max() > 0, name
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7,
                               err_msg=name)


@pytest.mark.parametrize("layers", ["bert_model", "transformer_model"])
def test_dropout_gradient_is_the_derivative_of_the_forward_that_ran(layers):
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(5)
    ids, mask = _inputs()
    config = modeling.BertConfig(**{**CONFIG.to_dict(),
                                    "hidden_dropout_prob": 0.3,
                                    "attention_probs_dropout_prob": 0.3})
    if layers == "bert_model":
      loss = _loss(modeling.BertModel(config, True, ids, mask,
                                      recompute=True))
    else:
      embedded = tf.one_hot(ids, 16) * 3.0
      attention = modeling.create_attention_mask_from_input_mask(ids, mask)
      with tf.compat.v1.variable_scope("encoder"):
        output = modeling.transformer_model(
            embedded, attention, hidden_size=16, num_hidden_layers=3,
            num_attention_heads=2, intermediate_size=32,
            hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3,
            recompute=True)
      loss = tf.reduce_sum(output * tf.constant(
          np.random.RandomState(3).randn(BATCH, LENGTH, 16), tf.float32))
    variable = [v for v in tf.compat.v1.trainable_variables()
                if "layer_0/intermediate/dense/kernel" in v.name][0]
    (gradient,) = tf.gradients(loss, [variable])
    seeds = [op.outputs[0] for op in graph.get_operations()
             if op.type == "RandomUniformInt" and "_seed/" in op.name]
    assert len(seeds) == 3  # one per layer
    # Dropout outside the layers (the embeddings') draws as it always does:
    # fed too, so that the loss is one function of the variable.
    outside = [op.outputs[0] for op in graph.get_operations()
               if op.type == "RandomUniform" and op.outputs[0].consumers()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      drawn = dict(zip(seeds + outside, session.run(seeds + outside)))
      start = session.run(variable)
      direction = np.random.RandomState(2).randn(*start.shape)
      direction /= np.linalg.norm(direction)
      slope = float(np.sum(session.run(gradient, drawn) * direction))
      epsilon = 1e-2
      values = []
      for sign in (1, -1):
        variable.load(start + sign * epsilon * direction, session)
        values.append(session.run(loss, drawn))
      numeric = (values[0] - values[1]) / (2 * epsilon)
      # Another draw of the masks gives another slope: the check can fail.
      other = {**drawn, **dict(zip(seeds, session.run(seeds)))}
      variable.load(start, session)
      other_slope = float(np.sum(session.run(gradient, other) * direction))
  assert abs(slope) > 1e-3
  np.testing.assert_allclose(slope, numeric, rtol=2e-2)
  assert abs(other_slope - numeric) > 10 * abs(slope - numeric)
