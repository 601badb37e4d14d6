"""BERT input features: examples → token ids → TFRecord files → input_fn.

The record format is google-research/bert's (`input_ids`, `input_mask`,
`segment_ids`, `label_ids`, `is_real_example`, padded to max_seq_length), so
files written here and there are interchangeable. The input_fn trims each
batch to its longest real sequence: padding past it changes nothing in the
model's output (it is masked out of attention) but costs compute.
"""

import collections
import hashlib
import json
import os

import numpy as np
import tensorflow as tf
from absl import logging

from data import sharding
from estimator_accum import _files
from estimator_accum.integrations.input_options import without_autotune

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")
# Part of every cache key: bump it when the conversion changes.
FEATURES_FORMAT = 1



def _truncate_pair(tokens_a, tokens_b, max_length):
  """Removes tokens from the longer sequence until both fit (Google's rule)."""
  while len(tokens_a) + len(tokens_b) > max_length:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    longer.pop()


def convert_examples_to_features(examples, label_list, max_seq_length,
                                 tokenizer):
  """Returns a dict of int32 arrays [num_examples, ...] for the examples.

  Examples without a label (test sets) get label id 0; `is_real_example` is 1
  for every example here.
  """
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length must be >= 3 ([CLS] x [SEP]), got "
                     f"{max_seq_length}.")
  label_map = {label: index for index, label in enumerate(label_list)}
  tokens_a = tokenizer.tokenize_batch([ex.text_a for ex in examples])
  pairs = [ex for ex in examples if ex.text_b is not None]
  tokens_b = iter(tokenizer.tokenize_batch([ex.text_b for ex in pairs]))
  count = len(examples)
  arrays = {name: np.zeros((count, max_seq_length), np.int32)
            for name in FEATURE_NAMES}
  arrays["label_ids"] = np.zeros(count, np.int32)
  arrays["is_real_example"] = np.ones(count, np.int32)
  cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
  truncated = 0
  for row, (example, a) in enumerate(zip(examples, tokens_a, strict=True)):
    b = next(tokens_b) if example.text_b is not None else []
    room = max_seq_length - (3 if example.text_b is not None else 2)
    truncated += len(a) + len(b) > room
    a, b = list(a), list(b)
    _truncate_pair(a, b, room)
    ids = ([cls_id] + tokenizer.convert_tokens_to_ids(a) + [sep_id])
    segments = [0] * len(ids)
    if example.text_b is not None:
      ids += tokenizer.convert_tokens_to_ids(b) + [sep_id]
      segments += [1] * (len(b) + 1)
    arrays["input_ids"][row, :len(ids)] = ids
    arrays["input_mask"][row, :len(ids)] = 1
    arrays["segment_ids"][row, :len(ids)] = segments
    if example.label is not None:
      arrays["label_ids"][row] = label_map[example.label]
  if truncated:
    # Past a tenth, the model no longer sees most of what it classifies.
    log = logging.warning if truncated * 10 > count else logging.info
    log("%d of %d examples were truncated to max_seq_length=%d%s.",
        truncated, count, max_seq_length,
        "; raise --max_seq_length to keep their tokens"
        if truncated * 10 > count else "")
  return arrays


def write_tfrecord(features, output_file):
  """Writes the feature arrays as tf.train.Examples; returns the count."""
  count = len(features["label_ids"])
  # Workers of one job may write the same file at once: each through its
  # own temporary; the rename is atomic and their contents are identical.
  with _files.whole(output_file) as temporary, tf.io.TFRecordWriter(
      temporary) as writer:
    for row in range(count):
      feature = collections.OrderedDict()
      for name in FEATURE_NAMES:
        feature[name] = _int_feature(features[name][row])
      feature["label_ids"] = _int_feature([features["label_ids"][row]])
      feature["is_real_example"] = _int_feature(
          [features["is_real_example"][row]])
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())
  return count


def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(
      value=[int(value) for value in values]))


def cache_key(examples, label_list, max_seq_length, tokenizer):
  """A 16-hex-digit key of everything the features of `examples` depend on:
  the examples themselves (ids, texts, labels), the label list,
  max_seq_length and the tokenizer (its vocabulary, case and version)."""
  digest = hashlib.sha256()
  identity = getattr(tokenizer, "identity", None)
  digest.update(json.dumps({
      "labels": list(label_list), "max_seq_length": max_seq_length,
      "tokenizer": identity() if identity else type(tokenizer).__name__,
      "format": FEATURES_FORMAT}).encode())
  for example in examples:
    digest.update(json.dumps([example.guid, example.text_a, example.text_b,
                              example.label]).encode())
  return digest.hexdigest()[:16]


def _first_line(error):
  """An error's first line, at most 160 characters."""
  text = str(error).strip()
  return text.splitlines()[0][:160] if text else ""


def _damage(path, expected):
  """What is wrong with the cached file `path` of `expected` records (a
  record cut short or failing its checksum, or another count), or None."""
  count = 0
  try:
    for _ in tf.compat.v1.io.tf_record_iterator(path):
      count += 1
  except tf.errors.OpError as error:
    return f"cannot be read past record {count} ({_first_line(error)})"
  if count != expected:
    return f"holds {count} of the {expected} examples"
  return None


def cached_tfrecord(examples, label_list, max_seq_length, tokenizer,
                    output_file, report=None, shared_dir=None):
  """Writes output_file once (kept when it exists whole); returns its
  example count. Name the file by `cache_key`, so that no other input
  reuses it. A file that is cut short, fails a record's checksum or holds
  another number of examples is written again, and `report` (a callable
  taking one line) told why: it is never read as fewer examples.

  `shared_dir`: a directory of features shared by runs (`feature_cache`),
  where the file of output_file's name is copied from when it is whole
  (no tokenizing) and put after a write. A damaged shared file is told and
  written again; one that cannot be put there (a read-only or full disk)
  is told in one line, and the run goes on with its own."""
  def tell(line):
    if report is not None:
      report(line)

  count = len(examples)
  damaged = None
  if tf.io.gfile.exists(output_file):
    damaged = _damage(output_file, count)
    if damaged is None:
      return count
  shared = (os.path.join(shared_dir, os.path.basename(output_file))
            if shared_dir else None)
  tf.io.gfile.makedirs(os.path.dirname(output_file) or ".")
  if shared is not None and tf.io.gfile.exists(shared):
    wrong = _damage(shared, count)
    if wrong is None:
      if damaged is not None:
        tell(f"cached features {output_file} {damaged}: copying them "
             f"from {shared}")
      with _files.whole(output_file) as temporary:
        tf.io.gfile.copy(shared, temporary, overwrite=True)
      return count
    tell(f"shared features {shared} {wrong}: writing them again")
  if damaged is not None:
    tell(f"cached features {output_file} {damaged}: writing them again")
  features = convert_examples_to_features(examples, label_list,
                                          max_seq_length, tokenizer)
  write_tfrecord(features, output_file)
  if shared is not None:
    try:
      tf.io.gfile.makedirs(shared_dir)
      with _files.whole(shared) as temporary:
        tf.io.gfile.copy(output_file, temporary, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
      tell(f"features not kept in the shared cache {shared_dir} "
           f"({type(error).__name__}: {_first_line(error)}); this run has "
           "its own")
  return count


# The directory of features shared by runs (default features/ in the
# pretrained models' cache directory; empty: none).
FEATURE_CACHE_ENV = "ESTIMATOR_ACCUM_FEATURE_CACHE"


def feature_cache():
  """$ESTIMATOR_ACCUM_FEATURE_CACHE (empty: no shared features), else
  features/ in the cache directory ($ESTIMATOR_ACCUM_CACHE, else
  ~/.cache/estimator_accum)."""
  if FEATURE_CACHE_ENV in os.environ:
    return os.environ[FEATURE_CACHE_ENV] or None
  from models.bert import pretrained  # noqa: PLC0415

  return os.path.join(pretrained.default_cache_dir(), "features")


def input_fn_builder(input_file, seq_length, batch_size, is_training,
                     drop_remainder, seed=None, shard=None, skip_batches=0,
                     trim=True, sort_window=None, pack_window=None,
                     max_examples_per_row=8, pad_to_multiple_of=1,
                     example_keys=False):
  """An Estimator input_fn over the TFRecord file.

  Training repeats forever and shuffles; Estimator's max_steps ends it.
  Under a distribution strategy with an input context (multi-worker), each
  input pipeline reads its own shard of the file; `shard` = (count, index)
  does the same without a strategy (parameter-server workers).
  `skip_batches`: batches to skip first, so that a run resumed from a
  checkpoint at that many micro-batches goes on with the very batches the
  uninterrupted run would have trained on (the shuffle is seeded).
  `trim`: cut each batch to its longest example (else every batch is
  `seq_length` long, the most memory a batch can take), rounded up to a
  multiple of `pad_to_multiple_of` (at most `seq_length`): fewer distinct
  shapes, for a compiler that compiles each shape anew (XLA).
  `sort_window`: k, to sort the examples of each window of k batches by
  length before they are cut into its k batches (training): the window's
  update, the mean over the same k x batch_size examples, is the same,
  and trimmed batches of like lengths compute less padding. Each input
  pipeline (a worker) sorts its own; a resumed run skips sorted batches,
  so it goes on with the very batches of the uninterrupted run. Not
  training (evaluation), each chunk of `sort_window` batches of the file
  is sorted so, the last chunk kept however short: the same examples, in
  batches of like lengths (not for prediction, whose outputs follow the
  file's order).
  `pack_window`: k, to pack the examples of each window of k batches into
  rows of `seq_length` instead (`models.bert.packing`: longest first,
  first fit, at most `max_examples_per_row` a row), cut into k batches of
  as many rows each: features `example_ids` and `label_ids` [rows,
  max_examples_per_row], which the classifier trains on as the same
  examples one per row. A batch holds at most `batch_size` rows.
  `example_keys`: training batches carry `example_key` (int64 [batch]),
  each example's place in its pipeline's training stream (times the
  pipelines, plus this one's index): a key that names the example
  whichever micro-batch it lands in, for keyed dropout
  (`BertModel(..., dropout_keys=...)`). Not with `pack_window`.
  """
  schema = {name: tf.io.FixedLenFeature([seq_length], tf.int64)
            for name in FEATURE_NAMES}
  schema["label_ids"] = tf.io.FixedLenFeature([], tf.int64)
  schema["is_real_example"] = tf.io.FixedLenFeature([], tf.int64)

  def parse(*batch):
    # (keys, records) with example_keys, else (records,).
    parsed = tf.io.parse_example(batch[-1], schema)
    parsed = {name: tf.cast(value, tf.int32) for name, value in parsed.items()}
    if len(batch) == 2:
      parsed["example_key"] = batch[0]
    return parsed

  def sort_by_length(*batch):
    parsed = parse(*batch)
    order = tf.argsort(tf.reduce_sum(parsed["input_mask"], axis=1),
                       stable=True)
    return {name: tf.gather(value, order) for name, value in parsed.items()}

  def trimmed(parsed):
    if not trim:
      return parsed
    parsed = dict(parsed)
    # (At least 1: a packed window of fewer rows than k micro-batches
    # leaves some only empty rows.)
    length = tf.maximum(
        tf.reduce_max(tf.reduce_sum(parsed["input_mask"], axis=1)), 1)
    if pad_to_multiple_of > 1:
      length = tf.minimum(
          (length + pad_to_multiple_of - 1) // pad_to_multiple_of *
          pad_to_multiple_of, seq_length)
    for name in FEATURE_NAMES + ("example_ids",):
      if name in parsed:
        parsed[name] = parsed[name][:, :length]
    return parsed

  if (isinstance(pad_to_multiple_of, bool) or
      not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
    raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r}: must be a "
                     "whole number >= 1")
  sorting = bool(sort_window and sort_window > 1)
  packing_k = pack_window if (pack_window and is_training) else None
  if packing_k and sorting:
    raise ValueError(f"sort_window={sort_window} and pack_window="
                     f"{pack_window}: one arrangement of a window, not both")
  keyed = bool(example_keys and is_training)
  if keyed and packing_k:
    raise ValueError(f"example_keys=True and pack_window={pack_window}: "
                     "keys name one example a row, not packed rows")

  def packed(*batch):
    from models.bert import packing  # noqa: PLC0415

    windows = packing.pack_window(parse(*batch), packing_k, seq_length,
                                  max_examples_per_row)
    windows["label_ids"].set_shape([None, None, max_examples_per_row])
    return windows

  # Python's own control flow only (on the flags above, not on tensors):
  # tf.data need not convert them with autograph, which took 0.3 s of
  # CPU per input pipeline (packing's most).
  parse, sort_by_length, trimmed, packed = (
      tf.autograph.experimental.do_not_convert(function)
      for function in (parse, sort_by_length, trimmed, packed))

  def input_fn(params=None, input_context=None):
    del params
    dataset = tf.data.TFRecordDataset(input_file)
    dataset = sharding.shard(dataset, input_context,
                             *(shard or (None, None)))
    if is_training:
      dataset = dataset.shuffle(10_000, seed=seed,
                                reshuffle_each_iteration=True).repeat()
    if keyed:
      count, index = sharding.pipeline(input_context,
                                       *(shard or (None, None)))
      dataset = dataset.enumerate().map(tf.autograph.experimental.
                                        do_not_convert(
          lambda place, record: (place * count + index, record)))
    if packing_k:
      dataset = dataset.batch(batch_size * packing_k, drop_remainder=True)
      dataset = dataset.map(packed,
                            num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if sorting:
      # (Training repeats: a window is always whole. An evaluation keeps
      # its last, shorter chunk.)
      dataset = dataset.batch(batch_size * sort_window,
                              drop_remainder=is_training)
      dataset = dataset.map(sort_by_length,
                            num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if not packing_k:
      dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if skip_batches:
      dataset = dataset.skip(skip_batches)
    if not (sorting or packing_k):
      dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(trimmed, num_parallel_calls=tf.data.AUTOTUNE)
    # Autotuning off: the main job's training ended 45-51 s after its last
    # checkpoint in 3 of 5 one-epoch runs, a session's close waiting for
    # tf.data's model thread (estimator_accum.without_autotune).
    return without_autotune(dataset.prefetch(tf.data.AUTOTUNE))

  return input_fn
