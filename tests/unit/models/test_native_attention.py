"""estimator_accum.native's attention over unpadded tokens (attention.cc,
models.bert's training graphs with `unpadded`): the padded layout's
function (TensorFlow's ops: scatter into rows, heads, softmax with the
padding's bias, keyed dropout, gather) to float32 rounding, forward and
backward, with the same dropout masks; examples of no real token and of
one; bad inputs refused; a whole BERT's gradients alike with the op and
without it, dropout on."""

import math
import types

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from estimator_accum.window import keyed_dropout
from models.bert import classifier_training, modeling
from tests.helpers import native_kernels

_loaded = native_kernels.loaded
SITE = "layer_0/attention/self/probs"


def _both(lengths, heads, size, rate, length=None):
  """(padded ops' (context, gradients), the op's (context, gradients)) of
  random unpadded queries, keys and values of examples of `lengths`."""
  ops = native.load()
  rng = np.random.RandomState(sum(lengths) + heads)
  batch, length = len(lengths), length or max(max(lengths), 1)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(
      np.int32)
  tokens, hidden = int(mask.sum()), heads * size
  with tf.Graph().as_default():
    q, k, v, w = (tf.constant(rng.normal(size=[tokens, hidden]).astype(
        np.float32)) for _ in range(4))
    real = tf.where(tf.reshape(mask > 0, [-1]))
    keys = keyed_dropout.token_keys(keyed_dropout.example_keys(
        tf.range(batch) * 7 + 3, 11), length, 11)
    grid = keyed_dropout.per_head(keys, heads, 11)

    def rows_of(x):
      return tf.transpose(tf.reshape(tf.scatter_nd(
          real, x, [batch * length, hidden]), [batch, length, heads, size]),
                          [0, 2, 1, 3])

    bias = (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * -10000.0
    probs = tf.nn.softmax(tf.matmul(rows_of(q), rows_of(k), transpose_b=True)
                          / math.sqrt(size) + bias)
    if rate:
      probs = keyed_dropout.keyed_dropout(probs, rate, grid, seed=11,
                                          site=SITE, one_pass=False)
    padded = tf.gather_nd(tf.reshape(tf.transpose(
        tf.matmul(probs, rows_of(v)), [0, 2, 1, 3]), [-1, hidden]), real)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = tf.cast(real[:, 0] % length, tf.int32)
    if rate:
      words = keyed_dropout.words(rate, grid, length, seed=11, site=SITE)
      scale = 1.0 / (1.0 - rate)
    else:
      words = (tf.zeros([0, 0, 0], tf.uint32), tf.zeros([0], tf.uint32), 0)
      scale = 1.0
    fused = native.attention_op()(
        q, k, v, starts, positions, *words[:2], heads=heads,
        divisor=math.sqrt(size), threshold=words[2], scale=scale)
    types = {op.type for op in tf.compat.v1.get_default_graph()
             .get_operations()}
    assert ops is not None and "EaAttention" in types
    fetches = [(c, tf.gradients(tf.reduce_sum(c * w), [q, k, v]))
               for c in (padded, fused)]
    assert "EaAttentionGrad" in {
        op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    with tf.compat.v1.Session() as session:
      return session.run(fetches)


def _assert_close(theirs, mine):
  assert theirs.shape == mine.shape
  if not theirs.size:
    return
  largest = max(float(np.abs(theirs).max()), 1e-30)
  np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6 * largest)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("lengths,heads,size", [
    ([13, 1, 7, 0, 10], 4, 8), ([30, 28, 29, 27, 30, 26, 25, 30], 12, 32),
    ([1], 1, 1), ([0, 0], 2, 3)])
def test_the_padded_layouts_function_and_masks(lengths, heads, size, rate):
  _loaded()
  (padded, padded_grads), (fused, fused_grads) = _both(lengths, heads, size,
                                                       rate)
  _assert_close(padded, fused)
  for theirs, mine in zip(padded_grads, fused_grads):
    _assert_close(theirs, mine)


def test_a_dropped_mask_changes_the_context():
  # Negative control: another site's masks are not the padded ops'.
  _loaded()
  global SITE
  saved = SITE
  try:
    (padded, _), _ = _both([9, 7], 2, 4, 0.5)
    SITE = "another/probs"
    _, (fused, _) = _both([9, 7], 2, 4, 0.5)
  finally:
    SITE = saved
  assert np.abs(padded - fused).max() > 1e-2


@pytest.mark.parametrize("starts,message", [
    ([0, 2], "starts must begin at 0 and end at the token count"),
    ([0, 3, 2, 3], "starts must not decrease"),
    ([1, 3], "starts must begin at 0")])
def test_bad_starts_are_refused(starts, message):
  _loaded()
  with tf.Graph().as_default():
    x = tf.zeros([3, 4])
    context = native.attention_op()(
        x, x, x, tf.constant(starts, tf.int32), tf.zeros([3], tf.int32),
        tf.zeros([0, 0, 0], tf.uint32), tf.zeros([0], tf.uint32), heads=2,
        divisor=1.0, threshold=0, scale=1.0)
    with tf.compat.v1.Session() as session, pytest.raises(
        tf.errors.InvalidArgumentError, match=message):
      session.run(context)


@pytest.mark.parametrize("config", [
    native_kernels.NO_DROPOUT, dict(hidden_dropout_prob=0.1,
                                    attention_probs_dropout_prob=0.3)])
def test_bert_trains_alike_with_the_op_and_without(config, monkeypatch):
  # The tiny BERT's training graph, unpadded, dropout keyed by example:
  # the op in its layers (not the last, which computes [CLS] only), or
  # TensorFlow's ops (fused_attention=False), the same gradients.
  _loaded()
  keys = np.array([5, 9, 2], np.int64)

  def gradients(fused):
    return native_kernels.tiny_bert(config=config, unpadded=True,
                                    pooled_only=True, dropout_keys=keys,
                                    fused_attention=fused)

  mine, types = gradients(True)
  assert {"EaAttention", "EaAttentionGrad"} <= types
  theirs, types = gradients(False)
  assert not {"EaAttention", "EaAttentionGrad"} & types
  largest = max(float(np.abs(g).max()) for g in theirs)
  for a, b in zip(mine, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * largest)
  monkeypatch.setattr(native, "attention_op", lambda: None)
  _, types = gradients(True)
  assert "EaAttention" not in types


def test_graphs_to_evaluate_hold_tensorflows_ops():
  _loaded()
  _, types = native_kernels.tiny_bert(training=False, unpadded=True)
  assert "EaAttention" not in types


def test_fused_attention_that_is_not_a_bool():
  with pytest.raises(ValueError, match="fused_attention must be True or "
                                       "False, got 'yes'"):
    native_kernels.tiny_bert(unpadded=True, fused_attention="yes")


def _graph_holds_the_op(attention_dropout, *, unpadded, fused_attention,
                        pack_windows, use_fp16, keyed_dropout):
  """Whether a tiny BERT's training graph built as run_classifier builds
  it for these flags holds the native attention (graph only, not run)."""
  bert_config = modeling.BertConfig(
      vocab_size=50, hidden_size=16, num_hidden_layers=2,
      num_attention_heads=2, intermediate_size=24,
      attention_probs_dropout_prob=attention_dropout)
  ids = np.arange(27, dtype=np.int32).reshape([3, 9]) % 50
  with tf.Graph().as_default() as graph:
    arguments = dict(unpadded=unpadded, fused_attention=fused_attention,
                     compute_type=tf.float16 if use_fp16 else tf.float32)
    if pack_windows:
      arguments.update(example_ids=tf.constant(
          np.array([[1] * 4 + [2] * 5] * 3, np.int32)), max_examples=2)
    elif keyed_dropout:
      arguments.update(dropout_keys=tf.constant([5, 9, 2], tf.int64))
    modeling.BertModel(bert_config, True, tf.constant(ids),
                       tf.constant(np.ones([3, 9], np.int32)), **arguments)
    return "EaAttention" in {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])
@pytest.mark.parametrize("changed", [
    {}, dict(fused_attention=False), dict(unpadded=False),
    dict(pack_windows=True), dict(use_fp16=True), dict(keyed_dropout=False)])
def test_the_runs_line_says_whether_its_graph_holds_the_op(
    attention_dropout, changed):
  # run_classifier's line on attention (classifier_training.describe)
  # says the native op runs exactly where the training graph it builds
  # holds it.
  _loaded()
  flags = {**dict(unpadded=True, fused_attention=True, pack_windows=False,
                  use_fp16=False, keyed_dropout=True), **changed}
  said = classifier_training.attention_fused(
      types.SimpleNamespace(**flags), modeling.BertConfig(
          vocab_size=50, attention_probs_dropout_prob=attention_dropout))
  assert said == _graph_holds_the_op(attention_dropout, **flags)
  assert said == (not changed or (changed == dict(keyed_dropout=False) and
                                  not attention_dropout))
