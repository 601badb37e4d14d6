"""Task processors on small files in the public formats, the offline Rotten
Tomatoes split, and BERT features through TFRecord files and the input_fn."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data import bert_features, classification
from models.bert import tokenization
from tests.helpers import bert_fixtures


def _write(directory, name, text):
  path = directory / name
  path.write_text(text, encoding="utf-8")
  return path


@pytest.fixture
def tokenizer(tmp_path):
  vocab = _write(tmp_path, "vocab.txt",
                 "\n".join(bert_fixtures.SPECIAL + bert_fixtures.WORDS) + "\n")
  return tokenization.FullTokenizer(str(vocab), do_lower_case=True)


def test_cola_mrpc_mnli_sst2_yelp_read_their_formats(tmp_path):
  _write(tmp_path, "train.tsv", "gj04\t1\t\tThe film is good .\n"
         "gj04\t0\t*\tFilm the good is .\n")
  examples = classification.get_processor("CoLA").get_train_examples(tmp_path)
  assert [(e.text_a, e.label) for e in examples] == [
      ("The film is good .", "1"), ("Film the good is .", "0")]

  _write(tmp_path, "dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
         "1\t1\t2\tThe film was fun .\tIt was a fun film .\n")
  (example,) = classification.get_processor("mrpc").get_dev_examples(tmp_path)
  assert (example.text_a, example.text_b, example.label) == (
      "The film was fun .", "It was a fun film .", "1")

  header = "\t".join(f"c{i}" for i in range(12)) + "\n"
  row = ["x"] * 8 + ["A man plays.", "Nobody plays.", "x", "contradiction"]
  _write(tmp_path, "dev_matched.tsv", header + "\t".join(row) + "\n")
  (example,) = classification.get_processor("mnli").get_dev_examples(tmp_path)
  assert (example.text_b, example.label) == ("Nobody plays.", "contradiction")

  _write(tmp_path, "test.tsv", "index\tsentence\n0\ta great movie\n")
  (example,) = classification.get_processor("sst2").get_test_examples(
      tmp_path)
  assert (example.text_a, example.label) == ("a great movie", None)

  _write(tmp_path, "train.csv", '"2","Great ""fun"".\\nWould go again."\n'
         '"1","Dull, dull, dull."\n')
  examples = classification.get_processor("yelp_polarity").get_train_examples(
      tmp_path)
  assert [(e.text_a, e.label) for e in examples] == [
      ('Great "fun". Would go again.', "2"), ("Dull, dull, dull.", "1")]


def test_xnli_reads_one_language_as_google_research_bert_does(tmp_path):
  (tmp_path / "multinli").mkdir()
  _write(tmp_path / "multinli", "multinli.train.zh.tsv",
         "premise\thypo\tlabel\n他在玩。\t没人在玩。\tcontradictory\n"
         "他在玩。\t有人在玩。\tentailment\n")
  examples = classification.get_processor("XNLI").get_train_examples(tmp_path)
  assert [(e.text_a, e.text_b, e.label) for e in examples] == [
      ("他在玩。", "没人在玩。", "contradiction"),
      ("他在玩。", "有人在玩。", "entailment")]
  header = "\t".join(["language", "gold_label"] + [f"c{i}" for i in range(6)])
  rows = [["en", "neutral"] + ["x"] * 4 + ["A man.", "A dog."],
          ["zh", "neutral"] + ["x"] * 4 + ["一个人。", "一只狗。"]]
  _write(tmp_path, "xnli.dev.tsv",
         "\n".join([header] + ["\t".join(r) for r in rows]) + "\n")
  (example,) = classification.get_processor("xnli").get_dev_examples(tmp_path)
  assert (example.text_a, example.text_b, example.label) == (
      "一个人。", "一只狗。", "neutral")
  (example,) = classification.XnliProcessor("en").get_dev_examples(tmp_path)
  assert example.text_a == "A man."
  with pytest.raises(classification.DataError, match="no examples in "
                     "language 'de'"):
    classification.XnliProcessor("de").get_dev_examples(tmp_path)


def test_missing_file_malformed_row_and_unknown_label_name_file_and_line(
    tmp_path):
  processor = classification.get_processor("sst-2")
  with pytest.raises(classification.DataError, match="has no train.tsv"):
    processor.get_train_examples(tmp_path)
  _write(tmp_path, "train.tsv", "sentence\tlabel\ngood\t1\njust text\n")
  with pytest.raises(classification.DataError,
                     match=r"train.tsv:3: expected at least 2 tab"):
    processor.get_train_examples(tmp_path)
  _write(tmp_path, "train.tsv", "sentence\tlabel\ngood\t1\nbad\tnegative\n")
  with pytest.raises(classification.DataError,
                     match=r"train.tsv:3: label 'negative' is not one of"):
    processor.get_train_examples(tmp_path)
  with pytest.raises(classification.DataError, match="task_name.*'qqp'"):
    classification.get_processor("qqp")


def test_rotten_tomatoes_splits_by_movie_without_plots():
  processor = classification.get_processor("rotten_tomatoes")
  splits = {split: getattr(processor, f"get_{split}_examples")(None)
            for split in ("train", "dev", "test")}
  sizes = {split: len(examples) for split, examples in splits.items()}
  total = sum(sizes.values())
  assert total == 12808  # 7403 fresh + 5405 rotten, the 1097 plots dropped.
  assert 0.05 < sizes["dev"] / total < 0.15
  assert 0.05 < sizes["test"] / total < 0.15
  texts = {split: {e.text_a for e in examples}
           for split, examples in splits.items()}
  assert len(texts["train"] & texts["test"]) < 20  # Reposted quotes only.
  for examples in splits.values():
    assert {e.label for e in examples} == {"fresh", "rotten"}


def test_features_pack_pairs_and_the_input_fn_trims_padding(tmp_path,
                                                            tokenizer):
  examples = [
      classification.InputExample("a", "the film was good", "the plot", "1"),
      classification.InputExample("b", "dull", None, "0"),
      classification.InputExample("c", "the the the the the the the the",
                                  "very very very very very", "1"),
  ]
  features = bert_features.convert_examples_to_features(
      examples, ["0", "1"], 10, tokenizer)
  ids = tokenizer.convert_tokens_to_ids
  np.testing.assert_array_equal(features["input_ids"][0], ids(
      ["[CLS]", "the", "film", "was", "good", "[SEP]", "the", "plot",
       "[SEP]", "[PAD]"]))
  np.testing.assert_array_equal(features["segment_ids"][0],
                                [0] * 6 + [1] * 3 + [0])
  # Longest-first truncation: 8 + 5 tokens into 7 places → 4 + 3.
  np.testing.assert_array_equal(features["input_mask"][2], [1] * 10)
  assert list(features["segment_ids"][2]).count(1) == 4
  np.testing.assert_array_equal(features["label_ids"], [1, 0, 1])

  path = str(tmp_path / "train.tf_record")
  assert bert_features.write_tfrecord(features, path) == 3
  input_fn = bert_features.input_fn_builder(path, 10, 2, is_training=False,
                                            drop_remainder=False)
  with tf.Graph().as_default():
    batch = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
    with tf.compat.v1.Session() as session:
      first, second = session.run(batch), session.run(batch)
  assert first["input_ids"].shape == (2, 9)  # Trimmed to its longest, 9.
  assert second["input_ids"].shape == (1, 10)
  np.testing.assert_array_equal(first["input_ids"][1, :3],
                                ids(["[CLS]", "dull", "[SEP]"]))
  np.testing.assert_array_equal(second["label_ids"], [1])


@pytest.mark.parametrize("options", [
    dict(is_training=False), dict(is_training=True),
    dict(is_training=True, sort_window=2), dict(is_training=True,
                                                pack_window=2)])
def test_the_input_runs_without_tf_datas_autotuning(tmp_path, options):
  # Its model thread, asleep up to 60 s in a long run, held a session's
  # close until it woke (45-51 s at the end of the main job's epochs).
  path = _varied_lengths_file(tmp_path)
  input_fn = bert_features.input_fn_builder(path, 12, 4, drop_remainder=True,
                                            seed=3, **options)
  with tf.Graph().as_default():
    assert input_fn().options().autotune.enabled is False


def _varied_lengths_file(tmp_path, count=24, length=12, longest=None):
  """`count` examples of lengths 2..longest (default length) in rows of
  `length` (example i's ids all i + 1)."""
  rng = np.random.RandomState(0)
  lengths = rng.randint(2, (longest or length) + 1, size=count)
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
  features = {"input_ids": mask * (np.arange(count)[:, None] + 1),
              "input_mask": mask, "segment_ids": np.zeros_like(mask),
              "label_ids": np.arange(count) % 2,
              "is_real_example": np.ones(count, np.int64)}
  path = str(tmp_path / "train.tf_record")
  bert_features.write_tfrecord(features, path)
  return path


def _batches(path, count, **options):
  input_fn = bert_features.input_fn_builder(
      path, 12, 4, is_training=True, drop_remainder=True, seed=3, **options)
  with tf.Graph().as_default():
    batch = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
    with tf.compat.v1.Session() as session:
      return [session.run(batch) for _ in range(count)]


def _examples(batches):
  """The example numbers of the batches, in order (each example's ids)."""
  return [int(row[0]) for b in batches for row in b["input_ids"]]


def test_a_window_sorted_by_length_holds_the_same_examples(tmp_path):
  # k=3 micro-batches of 4: each window's 12 examples, in the order the
  # shuffled input gives them, sorted by length and cut into 3 batches,
  # each trimmed to its longest.
  path = _varied_lengths_file(tmp_path)
  plain = _batches(path, 6)
  ordered = _batches(path, 6, sort_window=3)
  for window in range(2):
    mine = ordered[3 * window:3 * window + 3]
    theirs = plain[3 * window:3 * window + 3]
    assert sorted(_examples(mine)) == sorted(_examples(theirs))
    lengths = [int(n) for b in mine for n in b["input_mask"].sum(1)]
    assert lengths == sorted(lengths)
    for batch in mine:
      assert batch["input_ids"].shape[1] == batch["input_mask"].sum(1).max()
      # Every feature moved with its example.
      np.testing.assert_array_equal(batch["label_ids"],
                                    (batch["input_ids"][:, 0] - 1) % 2)
  padded = sum(b["input_ids"].size for b in ordered)
  assert padded < sum(b["input_ids"].size for b in plain)
  # A run resumed after 4 micro-batches (inside window 2) goes on with the
  # very batches of the uninterrupted run.
  resumed = _batches(path, 2, sort_window=3, skip_batches=4)
  assert _examples(resumed) == _examples(ordered[4:6])


def _packed_examples(batch):
  """(ids, length, label) of each example the packed rows hold (example
  i's ids are all i + 1, its label i % 2)."""
  found = []
  for row, ids, labels in zip(batch["example_ids"], batch["input_ids"],
                              batch["label_ids"]):
    for number in sorted(set(row[row > 0])):
      tokens = ids[row == number]
      assert len(set(tokens)) == 1  # one example's tokens, together
      found.append((int(tokens[0]), len(tokens), int(labels[number - 1])))
  return found


def test_a_packed_window_holds_the_same_examples_in_fewer_rows(tmp_path):
  # k=3 micro-batches of 4: each window's 12 examples (lengths 2..12) packed
  # into rows of 12, longest first, cut into 3 batches of as many rows.
  path = _varied_lengths_file(tmp_path)
  plain = _batches(path, 6)
  packed = _batches(path, 6, pack_window=3, max_examples_per_row=4)
  for window in range(2):
    mine = packed[3 * window:3 * window + 3]
    theirs = plain[3 * window:3 * window + 3]
    held = [e for batch in mine for e in _packed_examples(batch)]
    assert sorted(number for number, _, _ in held) == sorted(
        _examples(theirs))
    lengths = {int(row[0]): int(mask.sum()) for b in theirs
               for row, mask in zip(b["input_ids"], b["input_mask"])}
    for ids, length, label in held:
      assert label == (ids - 1) % 2  # the label moved with its example
      assert length == lengths[ids]  # and all its tokens
    rows = [len(batch["input_ids"]) for batch in mine]
    assert len(set(rows)) == 1 and rows[0] <= 4, rows
    for batch in mine:
      assert batch["label_ids"].shape[1] == 4
      assert (batch["example_ids"].max(initial=0) <= 4)
      # Each row's tokens from its start, no gap.
      for mask in batch["input_mask"]:
        assert list(mask) == sorted(mask, reverse=True)
  assert sum(b["input_ids"].size for b in packed) < sum(
      b["input_ids"].size for b in plain)
  # A run resumed after 4 micro-batches (inside window 2) goes on with the
  # very batches of the uninterrupted run.
  resumed = _batches(path, 2, pack_window=3, max_examples_per_row=4,
                     skip_batches=4)
  for mine, theirs in zip(resumed, packed[4:6]):
    for name in mine:
      np.testing.assert_array_equal(mine[name], theirs[name])


def test_sorting_and_packing_a_window_is_refused(tmp_path):
  with pytest.raises(ValueError, match="sort_window=3 and pack_window=3"):
    _batches(_varied_lengths_file(tmp_path), 1, sort_window=3, pack_window=3)


def test_a_window_packed_into_fewer_rows_than_k_leaves_empty_rows(tmp_path):
  # 12 examples of 2..3 tokens fit 3 rows of 12 or fewer; k=6 micro-batches
  # of 2: some hold one empty row (no example), trimmed to one token.
  path = _varied_lengths_file(tmp_path, count=12, longest=3)
  input_fn = bert_features.input_fn_builder(
      path, 12, 2, is_training=True, drop_remainder=True, seed=3,
      pack_window=6)
  with tf.Graph().as_default():
    batch = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
    with tf.compat.v1.Session() as session:
      window = [session.run(batch) for _ in range(6)]
  held = [e for b in window for e in _packed_examples(b)]
  assert sorted(ids for ids, _, _ in held) == list(range(1, 13))
  empty = [b for b in window if not b["example_ids"].any()]
  assert empty and all(b["input_ids"].shape[1] == 1 for b in empty)


def test_pad_to_multiple_of_rounds_each_trimmed_batch_up(tmp_path):
  # Rows of 12, examples of 2..12 tokens, sorted windows of 3 x 4: each
  # batch is its longest example rounded up to a multiple of 5, at most 12;
  # the same examples and tokens as without it, the rest zeros.
  path = _varied_lengths_file(tmp_path)
  plain = _batches(path, 6, sort_window=3)
  rounded = _batches(path, 6, sort_window=3, pad_to_multiple_of=5)
  assert _examples(rounded) == _examples(plain)
  for short, long in zip(plain, rounded):
    width = short["input_ids"].shape[1]
    assert long["input_ids"].shape[1] == min(-(-width // 5) * 5, 12)
    for name in ("input_ids", "input_mask", "segment_ids"):
      np.testing.assert_array_equal(long[name][:, :width], short[name])
      assert not long[name][:, width:].any()
  assert {b["input_ids"].shape[1] for b in rounded} <= {5, 10, 12}


@pytest.mark.parametrize("value", [0, 2.0, True])
def test_a_bad_pad_to_multiple_of_is_one_line(tmp_path, value):
  with pytest.raises(ValueError, match=f"pad_to_multiple_of={value!r}: "
                     "must be a whole number"):
    bert_features.input_fn_builder("unused", 12, 4, is_training=True,
                                   drop_remainder=True,
                                   pad_to_multiple_of=value)


def _cached(tmp_path, tokenizer, lines):
  examples = [classification.InputExample(str(i), "the film was good " * i,
                                          None, str(i % 2))
              for i in range(1, 7)]
  path = str(tmp_path / "features" / "train.tf_record")
  count = bert_features.cached_tfrecord(examples, ["0", "1"], 16, tokenizer,
                                        path, report=lines.append)
  return count, path


def _records(path):
  return sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path))


@pytest.mark.parametrize("damage", ["cut_at_a_record", "cut_in_a_record",
                                    "bit_flip"])
def test_damaged_cached_features_are_written_again(tmp_path, tokenizer,
                                                   damage):
  lines = []
  assert _cached(tmp_path, tokenizer, lines) == (6, str(
      tmp_path / "features" / "train.tf_record"))
  path = tmp_path / "features" / "train.tf_record"
  data = bytearray(path.read_bytes())
  record = len(data) // 6  # the records are of nearly one size
  if damage == "cut_at_a_record":
    # The first 4 records whole: read alone, 4 examples instead of 6.
    offsets, at = [], 0
    while at < len(data):
      offsets.append(at)
      at += 8 + 4 + int.from_bytes(data[at:at + 8], "little") + 4
    path.write_bytes(bytes(data[:offsets[4]]))
    assert _records(str(path)) == 4
    said = "holds 4 of the 6 examples"
  elif damage == "cut_in_a_record":
    path.write_bytes(bytes(data[:3 * record + record // 2]))
    said = "cannot be read past record 3"
  else:
    data[2 * record + 20] ^= 0x10
    path.write_bytes(bytes(data))
    said = "cannot be read past record"
  assert not lines
  count, _ = _cached(tmp_path, tokenizer, lines)
  assert count == 6 and _records(str(path)) == 6
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"cached features {path} {said}"), lines
  assert lines[0].endswith(": writing them again")


def test_whole_cached_features_are_kept(tmp_path, tokenizer):
  lines = []
  _, path = _cached(tmp_path, tokenizer, lines)
  before = os.stat(path).st_mtime_ns
  assert _cached(tmp_path, tokenizer, lines) == (6, path)
  assert os.stat(path).st_mtime_ns == before and not lines


def _cached_in(run_dir, shared_dir, tokenizer, lines):
  examples = [classification.InputExample(str(i), "the film was good " * i,
                                          None, str(i % 2))
              for i in range(1, 7)]
  path = str(run_dir / "features" / "train.tf_record")
  count = bert_features.cached_tfrecord(examples, ["0", "1"], 16, tokenizer,
                                        path, report=lines.append,
                                        shared_dir=str(shared_dir))
  return count, path


def test_a_new_run_copies_the_shared_features_without_tokenizing(
    tmp_path, tokenizer):
  lines = []
  shared = tmp_path / "shared"
  count, first = _cached_in(tmp_path / "run1", shared, tokenizer, lines)
  assert count == 6 and not lines
  written = (shared / "train.tf_record").read_bytes()
  assert written == open(first, "rb").read()
  # No tokenizer at all: the features come from the shared copy.
  count, second = _cached_in(tmp_path / "run2", shared, None, lines)
  assert count == 6 and not lines
  assert open(second, "rb").read() == written
  # No temporary left beside either copy.
  assert os.listdir(shared) == ["train.tf_record"]
  assert os.listdir(os.path.dirname(second)) == ["train.tf_record"]


def test_damaged_shared_features_are_written_again(tmp_path, tokenizer):
  lines = []
  shared = tmp_path / "shared"
  _cached_in(tmp_path / "run1", shared, tokenizer, lines)
  cached = shared / "train.tf_record"
  whole = cached.read_bytes()
  cached.write_bytes(whole[:-5])  # the last record's checksum cut
  count, path = _cached_in(tmp_path / "run2", shared, tokenizer, lines)
  assert count == 6 and _records(path) == 6
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"shared features {cached} cannot be read "
                             "past record 5"), lines
  assert lines[0].endswith(": writing them again")
  assert cached.read_bytes() == whole


def test_a_damaged_run_file_is_copied_from_whole_shared_features(
    tmp_path, tokenizer):
  lines = []
  shared = tmp_path / "shared"
  _, path = _cached_in(tmp_path / "run", shared, tokenizer, lines)
  with open(path, "r+b") as cut:
    cut.truncate(100)
  count, _ = _cached_in(tmp_path / "run", shared, None, lines)
  assert count == 6 and _records(path) == 6
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"cached features {path} cannot be read past "
                             "record 0")
  assert lines[0].endswith(f": copying them from {shared / 'train.tf_record'}")


def test_a_shared_cache_that_cannot_be_written_is_one_line(tmp_path,
                                                           tokenizer):
  lines = []
  blocked = tmp_path / "blocked"
  blocked.write_text("a file where the shared directory would be")
  count, path = _cached_in(tmp_path / "run", blocked, tokenizer, lines)
  assert count == 6 and _records(path) == 6
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"features not kept in the shared cache "
                             f"{blocked} (")
  assert lines[0].endswith("); this run has its own")


def test_an_evaluation_sorted_by_length_keeps_every_example_once(tmp_path):
  # 26 examples in batches of 4, sorted 3 batches (12 examples) at a time:
  # chunks of 12, 12 and 2 (the last kept, not dropped as a training
  # window would be), each sorted by length, cut into batches trimmed to
  # their longest; the last batch of each chunk may be short.
  path = _varied_lengths_file(tmp_path, count=26)

  def read(**options):
    input_fn = bert_features.input_fn_builder(
        path, 12, 4, is_training=False, drop_remainder=False, **options)
    with tf.Graph().as_default():
      batch = tf.compat.v1.data.make_one_shot_iterator(input_fn()).get_next()
      batches = []
      with tf.compat.v1.Session() as session:
        while True:
          try:
            batches.append(session.run(batch))
          except tf.errors.OutOfRangeError:
            return batches
  plain, ordered = read(), read(sort_window=3)
  assert _examples(plain) == list(range(1, 27))  # the file's order
  assert sorted(_examples(ordered)) == list(range(1, 27))
  assert [len(b["input_ids"]) for b in ordered] == [4, 4, 4, 4, 4, 4, 2]
  for start, chunk in zip((0, 12, 24),
                          (ordered[0:3], ordered[3:6], ordered[6:])):
    lengths = [int(n) for b in chunk for n in b["input_mask"].sum(1)]
    assert lengths == sorted(lengths)
    # The file's examples of that chunk, no other.
    assert sorted(_examples(chunk)) == list(
        range(start + 1, min(start + 12, 26) + 1))
  for batch in ordered:
    assert batch["input_ids"].shape[1] == batch["input_mask"].sum(1).max()
    np.testing.assert_array_equal(batch["label_ids"],
                                  (batch["input_ids"][:, 0] - 1) % 2)
  assert (sum(b["input_ids"].size for b in ordered) <
          sum(b["input_ids"].size for b in plain))
