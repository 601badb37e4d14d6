"""Our BERT against Hugging Face transformers' PyTorch BertModel, on the real
all-MiniLM-L6-v2 weights: tokens, sequence output, pooled output.

A check, not a benchmark, and not in the test suite: it needs PyTorch and
transformers, which the project does not install. Put them in a venv of
their own (the CPU build of torch lies on this machine kind's disk):

  python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.13.0 \\
      transformers==4.57.6
  .venv/bin/python benchmarks/hf_parity.py --hf_python /tmp/hf/bin/python

That venv tokenizes the sentences with the model's own tokenizer.json and
runs the PyTorch model; this process converts the checkpoint
(`models.bert.pretrained`, into the cache `run_classifier.py` uses), tokenizes with `FullTokenizer` and runs
`modeling.BertModel` on the same ids.
"""

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import bench  # noqa: E402
from harness.texts import SENTENCES  # noqa: E402
from models.bert import modeling, pretrained, tokenization  # noqa: E402

MAX_SEQ_LENGTH = 32

# Run by --hf_python: argv = model dir, sentences JSON, output .npz.
_HF_SIDE = """
import json, sys, numpy as np, torch
from transformers import AutoModel, AutoTokenizer
model_dir, sentences, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModel.from_pretrained(model_dir).eval()
batch = tokenizer(sentences, padding="max_length", max_length=int(sys.argv[4]),
                  truncation=True, return_tensors="pt")
with torch.no_grad():
  output = model(**batch)
np.savez(out, input_ids=batch["input_ids"].numpy(),
         input_mask=batch["attention_mask"].numpy(),
         token_type_ids=batch["token_type_ids"].numpy(),
         sequence=output.last_hidden_state.numpy(),
         pooled=output.pooler_output.numpy())
"""


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--hf_python", required=True,
                      help="a python with torch and transformers")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as work:
    reference_file = os.path.join(work, "hf.npz")
    subprocess.run(
        [args.hf_python, "-c", _HF_SIDE, str(pretrained.minilm_hf_dir()),
         json.dumps(SENTENCES), reference_file, str(MAX_SEQ_LENGTH)],
        check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    reference = dict(np.load(reference_file))
  checkpoint = pretrained.minilm_checkpoint()  # converted once, cached

  tokenizer = tokenization.FullTokenizer(checkpoint.vocab_file,
                                         do_lower_case=True)
  same_tokens = 0
  for sentence, ids in zip(SENTENCES, reference["input_ids"]):
    tokens = ["[CLS]"] + tokenizer.tokenize(sentence)[:MAX_SEQ_LENGTH - 2]
    ours = tokenizer.convert_tokens_to_ids(tokens + ["[SEP]"])
    same_tokens += ours == [int(i) for i in ids if i != 0]

  config = modeling.BertConfig.from_json_file(checkpoint.bert_config_file)
  with tf.Graph().as_default():
    model = modeling.BertModel(
        config, False,
        *(tf.constant(reference[name], tf.int32)
          for name in ("input_ids", "input_mask", "token_type_ids")))
    assignment, _ = modeling.get_assignment_map_from_checkpoint(
        tf.compat.v1.trainable_variables(), checkpoint.init_checkpoint)
    tf.compat.v1.train.init_from_checkpoint(checkpoint.init_checkpoint,
                                            assignment)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      sequence, pooled = session.run([model.get_sequence_output(),
                                      model.get_pooled_output()])

  real = reference["input_mask"].astype(bool)
  rows = bench.Rows(f"MiniLM against transformers, {len(SENTENCES)} "
                    "sentences", args.json, markdown=True,
                    formats={"max |ours - transformers|": ".2e",
                             "largest value": ".2f"})
  rows.add(**{"figure": "token ids equal to transformers' tokenizer",
              "max |ours - transformers|": "",
              "largest value": f"{same_tokens}/{len(SENTENCES)} sentences"})
  rows.add(**{"figure": "sequence output (real tokens)",
              "max |ours - transformers|": float(np.abs(
                  sequence - reference["sequence"])[real].max()),
              "largest value": float(np.abs(
                  reference["sequence"][real]).max())})
  rows.add(**{"figure": "pooled output",
              "max |ours - transformers|": float(np.abs(
                  pooled - reference["pooled"]).max()),
              "largest value": float(np.abs(reference["pooled"]).max())})
  if same_tokens != len(SENTENCES):
    rows.fail(f"{len(SENTENCES) - same_tokens} sentences tokenize "
              "differently")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
