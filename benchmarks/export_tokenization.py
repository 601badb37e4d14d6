"""The exported classifier's in-graph tokenization against the script's.

  .venv/bin/python benchmarks/export_tokenization.py [--task rotten_tomatoes]
      [--max_seq_length 128] [--json FILE]

Makes every eval example's ids both ways: with models.bert.tokenization's
FullTokenizer as run_classifier.py writes its features
(data/bert_features.py), and with the exported SavedModel's `text`
signature graph (models/bert/export.py: TensorFlow Text's BertTokenizer,
google-research/bert's truncation), on the offline MiniLM's vocabulary;
prints the examples whose ids differ, and the count. Exits 1 when any
differs.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from data import bert_features, classification  # noqa: E402
from harness import bench  # noqa: E402
from models.bert import export, pretrained, tokenization  # noqa: E402


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--task", default="rotten_tomatoes")
  parser.add_argument("--split", default="dev", choices=["dev", "train"])
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--data_dir", default=None)
  args = parser.parse_args()
  checkpoint = pretrained.minilm_checkpoint()
  processor = classification.get_processor(args.task)
  examples = (processor.get_dev_examples if args.split == "dev" else
              processor.get_train_examples)(args.data_dir)
  tokenizer = tokenization.FullTokenizer(checkpoint.vocab_file, True)
  made = bert_features.convert_examples_to_features(
      examples, processor.get_labels(), args.max_seq_length, tokenizer)
  pair = examples[0].text_b is not None
  ids = export.tokenize_in_graph(
      tf.constant([e.text_a for e in examples]),
      tf.constant([e.text_b for e in examples]) if pair else None,
      checkpoint.vocab_file, True, args.max_seq_length)
  graph = dict(zip(export.SERVING_INPUTS, (t.numpy() for t in ids)))
  differ = [i for i in range(len(examples)) if any(
      not np.array_equal(graph[k][i], made[k][i])
      for k in export.SERVING_INPUTS)]
  rows = bench.Rows(f"in-graph tokenization vs models.bert.tokenization, "
                    f"{args.task} {args.split}, max_seq_length "
                    f"{args.max_seq_length}", args.json)
  for i in differ[:20]:
    print(f"differs: example {i}: {examples[i].text_a!r}")
    print(f"  script: {made['input_ids'][i][made['input_mask'][i] > 0]}")
    print(f"  graph:  {graph['input_ids'][i][graph['input_mask'][i] > 0]}")
  rows.add(task=args.task, split=args.split, examples=len(examples),
           differing=len(differ))
  rows.print()
  if differ:
    rows.fail(f"{len(differ)} of {len(examples)} examples tokenize "
              "differently")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
