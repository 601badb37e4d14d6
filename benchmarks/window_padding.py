"""Token positions the main job computes, with and without length-sorted
windows (`run_classifier.py --sort_windows_by_length`, on by default) and
packed windows (`--pack_windows`: several examples a row).

The main job's training data (Rotten Tomatoes' train split, MiniLM's
WordPiece, max_seq_length 128) through the very input_fn run_classifier
trains from (data/bert_features.py), one epoch of micro-batches per row:
each micro-batch trimmed to its longest example, as today, or each
window's k x B examples sorted by length first, or packed into rows of
max_seq_length (at most 8 a row) cut into k micro-batches of as many rows,
each trimmed to its longest row. Counts, not times: the
figures are the same on every machine. Over three shuffles (seeds).

  python benchmarks/window_padding.py [--max_seq_length 128]
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from data import bert_features, classification  # noqa: E402
from harness import bench  # noqa: E402
from models.bert import pretrained, tokenization  # noqa: E402

SEEDS = (42, 7, 1234)
# (micro-batch B, k): the main job's default, and a small micro-batch.
SPLITS = ((8, 4), (2, 16))


def _features(max_seq_length, directory):
  processor = classification.get_processor("rotten_tomatoes")
  checkpoint = pretrained.minilm_checkpoint()
  tokenizer = tokenization.FullTokenizer(checkpoint.vocab_file, True)
  examples = processor.get_train_examples(None)
  path = os.path.join(directory, f"train-{max_seq_length}.tf_record")
  count = bert_features.cached_tfrecord(
      examples, processor.get_labels(), max_seq_length, tokenizer, path)
  return path, count


ARRANGEMENTS = {"trimmed": "each micro-batch trimmed (before)",
                "sorted": "sorted in each window",
                "packed": "packed in each window"}


def _positions(path, length, micro_batch, k, count, seed, arrangement):
  """(token positions computed, real tokens) over one epoch's micro-batches."""
  input_fn = bert_features.input_fn_builder(
      path, length, micro_batch, is_training=True, drop_remainder=True,
      seed=seed, sort_window=k if arrangement == "sorted" else None,
      pack_window=k if arrangement == "packed" else None)
  batches = (count // (micro_batch * k)) * k
  dataset = input_fn().take(batches).map(
      lambda f: (tf.size(f["input_ids"]), tf.reduce_sum(f["input_mask"])))
  computed = real = 0
  for size, tokens in dataset.as_numpy_iterator():
    computed += int(size)
    real += int(tokens)
  return computed, real


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--max_seq_length", type=int, default=128)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as directory:
    path, count = _features(args.max_seq_length, directory)
    rows = bench.Rows(
        f"Rotten Tomatoes train: {count} examples, max_seq_length "
        f"{args.max_seq_length}; token positions over one epoch of "
        f"micro-batches, mean of seeds {SEEDS}", args.json, markdown=True,
        formats={"token positions": ",.0f", "vs real tokens": ".2f"})
    real = None
    for micro_batch, k in SPLITS:
      for arrangement, said in ARRANGEMENTS.items():
        counted = [_positions(path, args.max_seq_length, micro_batch, k,
                              count, seed, arrangement) for seed in SEEDS]
        computed = float(np.mean([c[0] for c in counted]))
        real = float(np.mean([c[1] for c in counted]))
        rows.add(**{"micro-batch, k": f"{micro_batch}, {k}",
                    "input": said,
                    "token positions": computed,
                    "vs real tokens": computed / real})
    rows.add(**{"micro-batch, k": "", "input": "real tokens (no padding)",
                "token positions": real, "vs real tokens": 1.0})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
