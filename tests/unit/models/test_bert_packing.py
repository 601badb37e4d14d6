"""Packed rows (models/bert/packing.py): several examples in one row are
the model of one example per row. Each example's outputs, packed, equal
its outputs alone in a padded row (dropout off), token for token and for
its [CLS]."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support
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


def _one_per_row(examples):
  """input_ids, segment_ids and input_mask of the examples, one per padded
  row of SEQ_LENGTH."""
  rows = {name: np.zeros([len(examples), SEQ_LENGTH], np.int32)
          for name in ("input_ids", "segment_ids", "input_mask")}
  for row, (ids, segments) in enumerate(examples):
    rows["input_ids"][row, :len(ids)] = ids
    rows["segment_ids"][row, :len(ids)] = segments
    rows["input_mask"][row, :len(ids)] = 1
  return rows


def _outputs(model):
  return model.get_sequence_output(), model.get_pooled_output()


def _one_per_row_and_packed(examples):
  """Both models on shared weights: (sequence, pooled) of one example per
  padded row, and (sequence, pooled, example mask) of the packed rows."""
  packed = packing.pack(examples, SEQ_LENGTH)
  single = _one_per_row(examples)
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


NO_DROPOUT = modeling.BertConfig(
    **dict(CONFIG.to_dict(), hidden_dropout_prob=0.0,
           attention_probs_dropout_prob=0.0))
K, B, UPDATES, MAX_EXAMPLES = 2, 4, 3, SEQ_LENGTH // 2


def _train(micro_batches, packed):
  """The classifier's model_fn trained on `micro_batches` (feed dicts by
  feature name) from the same weights: its trained variables (start,
  end)."""
  from models.bert import classifier  # noqa: PLC0415

  with tf.Graph().as_default():
    names = ["input_ids", "segment_ids",
             "example_ids" if packed else "input_mask"]
    features = {name: tf.compat.v1.placeholder(tf.int32, [None, SEQ_LENGTH])
                for name in names}
    features["label_ids"] = tf.compat.v1.placeholder(
        tf.int32, [None, MAX_EXAMPLES] if packed else [None])
    training = classifier.TrainingConfig(
        num_labels=2, learning_rate=0.01, num_train_updates=UPDATES, k=K,
        classifier_dropout=0.0, log_every_n_micro_batches=1000)
    spec = classifier.model_fn_builder(NO_DROPOUT, training)(
        features, None, tf.estimator.ModeKeys.TRAIN)
    trained = tf.compat.v1.trainable_variables()
    rng = np.random.RandomState(1)
    start = {v.name: rng.normal(0.0, 0.1, v.shape).astype(np.float32)
             for v in sorted(trained, key=lambda v: v.name)}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      support.load_variables(session, {v: start[v.name] for v in trained})
      for feed in micro_batches:
        session.run(spec.train_op, {features[name]: value
                                    for name, value in feed.items()})
      return start, session.run({v.name: v for v in trained})


def _window_feeds(examples, labels):
  """Per window of K x B examples: K micro-batches of B padded rows, and K
  micro-batches of the window's examples packed (longest first), the rows
  split between them."""
  plain, packed = [], []
  for window in range(UPDATES):
    chosen = range(window * K * B, (window + 1) * K * B)
    for micro_batch in range(K):
      rows = list(chosen)[micro_batch * B:(micro_batch + 1) * B]
      feed = _one_per_row([examples[i] for i in rows])
      feed["label_ids"] = np.array([labels[i] for i in rows], np.int32)
      plain.append(feed)
    order = sorted(chosen, key=lambda i: -len(examples[i][0]))
    rows = packing.pack([examples[i] for i in order], SEQ_LENGTH)
    row_labels = np.zeros([len(rows["input_ids"]), MAX_EXAMPLES], np.int32)
    for index, (row, number) in zip(order, rows["placement"]):
      row_labels[row, number - 1] = labels[index]
    # As the input pipeline does: K micro-batches of as many rows, empty
    # rows (no example) at the end.
    split = -(-len(row_labels) // K)
    empty = split * K - len(row_labels)
    for name in ("input_ids", "segment_ids", "example_ids"):
      rows[name] = np.pad(rows[name], [(0, empty), (0, 0)])
    row_labels = np.pad(row_labels, [(0, empty), (0, 0)])
    for micro_batch in range(K):
      part = slice(micro_batch * split, (micro_batch + 1) * split)
      feed = {name: rows[name][part] for name in
              ("input_ids", "segment_ids", "example_ids")}
      feed["label_ids"] = row_labels[part]
      packed.append(feed)
  return plain, packed


@pytest.mark.estimator
@pytest.mark.slow  # trains the classifier twice (13 s)
@pytest.mark.parametrize("longest", [10, 2])
def test_packed_windows_train_to_the_unpacked_weights(longest):
  """The classifier on packed rows, each micro-batch weighted by the
  examples it holds (num_examples), ends where one example per row ends:
  AdamWeightDecay, clipped, k=2, 3 updates, at 1e-5. Examples of 2 tokens
  fill one row a window: its second micro-batch holds an empty row only."""
  rng = np.random.RandomState(3)
  lengths = rng.randint(min(3, longest), longest + 1, UPDATES * K * B)
  examples = _examples(lengths, seed=4)
  labels = rng.randint(0, 2, len(examples))
  plain, packed = _window_feeds(examples, labels)
  assert sum(len(f["input_ids"]) for f in packed) < sum(
      len(f["input_ids"]) for f in plain)
  # Micro-batches of one window hold different numbers of examples: the
  # weighting by num_examples decides the update.
  held = [len({(r, n) for r, row in enumerate(f["example_ids"])
               for n in row[row > 0]}) for f in packed]
  assert held[0::2] != held[1::2], held
  start, expected = _train(plain, packed=False)
  _, actual = _train(packed, packed=True)
  # 1e-5 of each variable's largest weight (and of each weight): packed
  # rows reorder float32 sums, and AdamWeightDecay divides each weight's
  # step by its own gradient's root mean square, so a weight whose
  # gradient is near zero moves by rounding. Element by element at
  # atol=1e-6, 2-token examples measured that, not the packing: seeds 3
  # and 5 ended 1.14 and 1.27 tolerances apart with the native layer norm,
  # 0.34 and 1.01 with TensorFlow's ops; with this one, 0.39 and 0.38, and
  # 0.13 and 0.39. A packing that weighted its examples wrongly would be
  # apart by a share of an update, far over it.
  for name, value in expected.items():
    np.testing.assert_allclose(actual[name], value, rtol=1e-5,
                               atol=1e-5 * float(np.abs(value).max()),
                               err_msg=name)
  assert any(not np.allclose(start[n], expected[n], atol=1e-4)
             for n in expected)


@pytest.mark.estimator
def test_packed_rows_are_for_training_only():
  from models.bert import classifier  # noqa: PLC0415

  with tf.Graph().as_default():
    features = {name: tf.zeros([1, SEQ_LENGTH], tf.int32)
                for name in ("input_ids", "segment_ids", "example_ids")}
    features["label_ids"] = tf.zeros([1, MAX_EXAMPLES], tf.int32)
    model_fn = classifier.model_fn_builder(
        NO_DROPOUT, classifier.TrainingConfig(num_labels=2))
    with pytest.raises(ValueError, match="packed rows .* are for training"):
      model_fn(features, None, tf.estimator.ModeKeys.EVAL)
