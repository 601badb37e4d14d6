"""Packed rows for BERT: several examples in one row of max_seq_length,
the same model as one example per row (Krell et al., "Efficient sequence
packing without cross-contamination", 2021; TensorFlow Model Garden's
packed-sequence embedding does the same).

A packed row says, for each token, which of the row's examples it belongs
to: `example_ids`, int32 [batch, seq_length], 1 for the row's first
example, 2 for its second, ..., 0 for padding. From it:

- each token attends to the tokens of its own example only (a block-diagonal
  attention bias, `attention_bias`);
- positions restart at 0 with each example (`position_ids`);
- each example's [CLS] is its first token (`first_tokens`), which the pooler
  reads.

Token types (segment ids) restart with each example in the input itself.
With dropout off an example's outputs equal the unpacked model's at float32
round-off (tests/unit/models/test_bert_packing.py).
"""

import tensorflow as tf

# What BERT adds to the attention scores of a key a token may not see, as in
# google-research/bert: exp(-10000) is 0 in float32.
_HIDDEN = -10000.0


def _same_example(example_ids):
  """bool [batch, seq_length, seq_length]: whether tokens i and j of a row
  share an example id."""
  return tf.equal(example_ids[:, :, tf.newaxis],
                  example_ids[:, tf.newaxis, :])


def attention_bias(example_ids):
  """float32 [batch, 1, seq_length, seq_length]: 0 where a token may attend
  (a real token of its own example), -10000 elsewhere."""
  allowed = tf.logical_and(_same_example(example_ids),
                           example_ids[:, tf.newaxis, :] > 0)
  return ((1.0 - tf.cast(allowed, tf.float32)) * _HIDDEN)[:, tf.newaxis]


def position_ids(example_ids):
  """int32 [batch, seq_length]: each token's position within its example
  (the number of earlier tokens of the same example)."""
  length = tf.shape(example_ids)[1]
  earlier = tf.range(length)[tf.newaxis, :] < tf.range(length)[:, tf.newaxis]
  return tf.reduce_sum(tf.cast(tf.logical_and(
      _same_example(example_ids), earlier[tf.newaxis]), tf.int32), axis=-1)


def first_tokens(example_ids, max_examples):
  """(int32 [batch, max_examples], bool [batch, max_examples]): the index of
  each example's first token in its row, and whether the row holds that
  example (a row holds examples 1..n, n <= max_examples)."""
  numbers = tf.range(1, max_examples + 1, dtype=example_ids.dtype)
  hit = tf.equal(example_ids[:, tf.newaxis, :],
                 numbers[tf.newaxis, :, tf.newaxis])
  return (tf.argmax(tf.cast(hit, tf.int32), axis=-1, output_type=tf.int32),
          tf.reduce_any(hit, axis=-1))


def window_layout(lengths, seq_length, max_examples, longest_first=True):
  """Where each example of a window goes: first fit, longest first (or in
  the order given), at most `max_examples` examples a row.

  Args:
    lengths: int numpy array, each example's token count (<= seq_length).

  Returns:
    int32 numpy arrays (row, number, start) per example, in the order given
    (number: 1 for a row's first example), and the number of rows.
  """
  import numpy as np  # noqa: PLC0415

  lengths = np.asarray(lengths)
  row = np.zeros(len(lengths), np.int32)
  number = np.zeros(len(lengths), np.int32)
  start = np.zeros(len(lengths), np.int32)
  used, held = [], []
  order = (np.argsort(-lengths, kind="stable") if longest_first else
           range(len(lengths)))
  for index in order:
    length = int(lengths[index])
    chosen = next((r for r in range(len(used))
                   if used[r] + length <= seq_length
                   and held[r] < max_examples), None)
    if chosen is None:
      used.append(0)
      held.append(0)
      chosen = len(used) - 1
    row[index], start[index] = chosen, used[chosen]
    held[chosen] += 1
    number[index] = held[chosen]
    used[chosen] += length
  return row, number, start, np.int32(len(used))


def pack_window(features, k, seq_length, max_examples):
  """A window's examples (one per row, `bert_features` names, each
  [k x batch, seq_length]) packed into rows and cut into k micro-batches of
  as many rows each (empty rows at the end, holding no example, if the rows
  do not divide): a dict of [k, rows, seq_length] (input_ids, segment_ids,
  input_mask, example_ids) and label_ids [k, rows, max_examples]."""
  lengths = tf.reduce_sum(features["input_mask"], axis=1)
  row, number, start, rows = tf.numpy_function(
      lambda lengths: window_layout(lengths, seq_length, max_examples),
      [lengths], [tf.int32] * 4, stateful=False)
  per_micro_batch = (rows + k - 1) // k
  total = per_micro_batch * k
  # Each real token of example e goes to (row[e], start[e] + position).
  positions = tf.range(seq_length)[tf.newaxis, :]
  real = positions < lengths[:, tf.newaxis]
  where = tf.stack([tf.broadcast_to(row[:, tf.newaxis], tf.shape(real)),
                    start[:, tf.newaxis] + positions], axis=-1)
  where = tf.boolean_mask(where, real)

  def scatter(values):
    return tf.scatter_nd(where, tf.boolean_mask(values, real),
                         tf.stack([total, seq_length]))

  packed = {"input_ids": scatter(features["input_ids"]),
            "segment_ids": scatter(features["segment_ids"]),
            "input_mask": scatter(features["input_mask"]),
            "example_ids": scatter(
                tf.broadcast_to(number[:, tf.newaxis], tf.shape(real)))}
  packed["label_ids"] = tf.scatter_nd(
      tf.stack([row, number - 1], axis=1), features["label_ids"],
      tf.stack([total, max_examples]))
  shape = tf.stack([k, per_micro_batch])
  return {name: tf.reshape(value, tf.concat([shape, tf.shape(value)[1:]], 0))
          for name, value in packed.items()}


def pack(examples, seq_length, rows=None):
  """Packs examples into rows, first fit in the order given (sort them by
  length, longest first, for fewer rows).

  Args:
    examples: list of (input_ids, segment_ids) pairs of int lists, each at
      most `seq_length` long.
    seq_length: the row length.
    rows: the number of rows to return (padded with empty rows); default as
      many as the examples need.

  Returns:
    dict of int32 numpy arrays [rows, seq_length]: input_ids, segment_ids,
    input_mask, example_ids; and "placement", a list of (row, example
    number) for each example, in the order given.

  Raises:
    ValueError: an example longer than seq_length, or more rows needed than
      `rows`.
  """
  import numpy as np  # noqa: PLC0415

  for index, (ids, _) in enumerate(examples):
    if len(ids) > seq_length:
      raise ValueError(f"example {index} has {len(ids)} tokens, above "
                       f"seq_length={seq_length}")
  row, number, start, needed = window_layout(
      [len(ids) for ids, _ in examples], seq_length, seq_length,
      longest_first=False)
  count = int(needed) if rows is None else rows
  if needed > count:
    raise ValueError(f"the examples need {needed} rows of "
                     f"{seq_length} tokens, more than rows={rows}")
  out = {name: np.zeros([count, seq_length], np.int32) for name in
         ("input_ids", "segment_ids", "input_mask", "example_ids")}
  for (ids, segments), r, n, first in zip(examples, row, number, start):
    span = slice(first, first + len(ids))
    out["input_ids"][r, span] = ids
    out["segment_ids"][r, span] = segments
    out["input_mask"][r, span] = 1
    out["example_ids"][r, span] = n
  out["placement"] = [(int(r), int(n)) for r, n in zip(row, number)]
  return out
