"""A fine-tuned BERT classifier as a SavedModel that serving loads.

`export_classifier(estimator, export_dir, ...)` writes, under `export_dir`,
a numbered version directory (`<export_dir>/<timestamp>/`, the layout
TensorFlow Serving reads a model's base path in) holding a SavedModel of
the PREDICT graph only: the model's weights from the latest checkpoint, no
optimizer slot, no accumulator, no window variable and no training op.
Its signatures:

- `serving_default`: `input_ids`, `input_mask`, `segment_ids` (int32,
  [batch, length], any length up to max_seq_length, as
  `data/bert_features.py` makes them) -> `probabilities` (float32,
  [batch, num_labels]). No label input.
- `text`: `text` (string, [batch]; and `text_b` for sentence-pair tasks)
  -> `probabilities`. Tokenized inside the graph by TensorFlow Text's
  `BertTokenizer` with the model's vocabulary as a SavedModel asset, then
  `[CLS] a [SEP] (b [SEP])`, truncated as google-research/bert truncates,
  padded to max_seq_length. A process that loads the SavedModel imports
  `tensorflow_text` first (its ops are not TensorFlow's own).
"""

import os

import tensorflow as tf
import tensorflow_text as text
from tensorflow.core.protobuf import saved_model_pb2

from estimator_accum.estimator import export as session_export

SERVING_INPUTS = ("input_ids", "input_mask", "segment_ids")
TEXT_SIGNATURE = "text"


def _special_ids(vocab_file):
  """{token: id} of [CLS], [SEP], [PAD] and [UNK] in the vocabulary."""
  wanted = {"[CLS]", "[SEP]", "[PAD]", "[UNK]"}
  found = {}
  with tf.io.gfile.GFile(vocab_file) as reader:
    for index, line in enumerate(reader):
      token = line.rstrip("\n").strip()
      if token in wanted:
        found.setdefault(token, index)
  missing = sorted(wanted - set(found))
  if missing:
    raise ValueError(f"vocab_file {vocab_file} has no {missing}.")
  return found


def tokenize_in_graph(sentences, sentences_b, vocab_file, do_lower_case,
                      max_seq_length):
  """(input_ids, input_mask, segment_ids): int32 [batch, max_seq_length] of
  string tensors `sentences` (and `sentences_b`, or None), as
  `data/bert_features.py` makes them from `models.bert.tokenization`.

  The vocabulary is a lookup table initialized from `vocab_file`, which a
  SavedModel then carries as an asset."""
  special = _special_ids(vocab_file)
  table = tf.lookup.StaticVocabularyTable(
      tf.lookup.TextFileInitializer(
          vocab_file, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
          tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
      num_oov_buckets=1)
  # Lower-cased and accents stripped as google-research/bert does (Unicode
  # lower case, NFD, combining marks dropped); BertTokenizer's own
  # lower_case folds with NFKC_Casefold, which also rewrites compatibility
  # characters ("½" to "1⁄2", "…" to "...") that Google's keeps.
  tokenizer = text.BertTokenizer(
      table, token_out_type=tf.int64, unknown_token="[UNK]",
      lower_case=False, max_bytes_per_word=100)

  def tokens(strings):
    if do_lower_case:
      strings = tf.strings.regex_replace(text.normalize_utf8(
          tf.strings.lower(strings, encoding="utf-8"), "NFD"), r"\p{Mn}", "")
    return tokenizer.tokenize(strings).merge_dims(-2, -1)

  segments = [tokens(sentences)]
  if sentences_b is not None:
    segments.append(tokens(sentences_b))
  # [CLS] and one [SEP] per segment.
  trimmed = truncate(segments, max_seq_length - 1 - len(segments))
  ids, types = text.combine_segments(
      trimmed, start_of_sequence_id=special["[CLS]"],
      end_of_segment_id=special["[SEP]"])
  input_ids, input_mask = text.pad_model_inputs(
      ids, max_seq_length, pad_value=special["[PAD]"])
  segment_ids, _ = text.pad_model_inputs(types, max_seq_length)
  return tuple(tf.cast(t, tf.int32) for t in (input_ids, input_mask,
                                              segment_ids))


def truncate(segments, budget):
  """`segments` (one or two ragged [batch, (tokens)]) cut to `budget`
  tokens in all, as google-research/bert's `_truncate_seq_pair` cuts a pair:
  one token at a time from the longer (from the second on a tie). In closed
  form: the first keeps min(a, max(budget - b, ceil(budget / 2))), the
  second min(b, max(budget - a, floor(budget / 2))). (TensorFlow Text's
  trimmers break on ties otherwise, and ShrinkLongestTrimmer cannot be built
  in a graph with control flow v2.)"""
  if len(segments) == 1:
    lengths = segments[0].row_lengths()
    limits = [tf.minimum(lengths, budget)]
  else:
    a, b = (s.row_lengths() for s in segments)
    limits = [tf.minimum(a, tf.maximum(budget - b, (budget + 1) // 2)),
              tf.minimum(b, tf.maximum(budget - a, budget // 2))]
  return [tf.ragged.boolean_mask(
      segment, tf.ragged.range(segment.row_lengths()) <
      tf.expand_dims(limit, 1)) for segment, limit in zip(segments, limits)]


def serving_input_receiver_fn(vocab_file, do_lower_case, max_seq_length,
                              pair=False):
  """The receiver of `export_classifier`'s two signatures.

  The ids the text signature makes are `placeholder_with_default` tensors
  of any length: `serving_default` feeds them directly (and runs no
  tokenization), `text` feeds the strings they are made from."""

  def receiver():
    sentences = tf.compat.v1.placeholder(tf.string, [None], name="text")
    strings = {"text": sentences}
    sentences_b = None
    if pair:
      sentences_b = tf.compat.v1.placeholder(tf.string, [None], name="text_b")
      strings["text_b"] = sentences_b
    made = tokenize_in_graph(sentences, sentences_b, vocab_file,
                             do_lower_case, max_seq_length)
    features = {
        name: tf.compat.v1.placeholder_with_default(value, [None, None],
                                                    name=name)
        for name, value in zip(SERVING_INPUTS, made)}
    return session_export.serving_input_receiver(
        features, dict(features),
        receiver_tensors_alternatives={TEXT_SIGNATURE: strings})

  return receiver


def export_classifier(estimator, export_dir, vocab_file, do_lower_case,
                      max_seq_length, pair=False, checkpoint_path=None):
  """Writes the SavedModel (see the module's docstring) of `estimator`'s
  latest checkpoint (or `checkpoint_path`) under `export_dir`; returns the
  version directory written."""
  path = estimator.export_saved_model(
      export_dir, serving_input_receiver_fn(vocab_file, do_lower_case,
                                            max_seq_length, pair),
      checkpoint_path=checkpoint_path)
  path = path.decode() if isinstance(path, bytes) else path
  _name_text_signature(path)
  return path


def _name_text_signature(path):
  """Renames Estimator's "text:serving_default" signature (its name for a
  receiver alternative's) to "text", and drops the "text:..." copies of
  other outputs, in the SavedModel at `path`."""
  proto_path = os.path.join(path, "saved_model.pb")
  model = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(proto_path, "rb") as reader:
    model.ParseFromString(reader.read())
  for meta_graph in model.meta_graphs:
    signatures = meta_graph.signature_def
    for name in [n for n in signatures if ":" in n]:
      receiver, output = name.split(":", 1)
      if receiver == TEXT_SIGNATURE and output == "serving_default":
        signatures[TEXT_SIGNATURE].CopyFrom(signatures[name])
      del signatures[name]
  with tf.io.gfile.GFile(proto_path, "wb") as writer:
    writer.write(model.SerializeToString())
