"""The planner at several memory budgets: which micro-batch x k it chooses
for an effective batch of 32, the peak it measured, the time per update of
that split, and how far its weights end from the big batch's.

  python benchmarks/plan_memory.py [--models minilm bert_small]
      [--budgets 3000 1600 1000 850] [--updates 3]

Both models classify the main job's real input (Rotten Tomatoes snippets,
128 tokens, uncased WordPiece) with the classifier of run_classifier.py,
dropout off: all-MiniLM-L6-v2 from its pretrained weights, and BERT-Small
(L=4, H=512) from random weights. Adam, learning rate 1e-4. Tensor memory
is the BFC allocator's peak, as on a GPU (TF_CPU_ALLOCATOR_USE_BFC=true).

For each budget: the planner's choice and its own time; the split's time
per update (after a warm-up window, the mean over --updates windows of a
bare session.run loop); and how far the weights after --updates updates of
the split are from those after as many plain Adam steps on batches of 32 of
the same examples: the largest absolute difference, and the largest
|difference| / (1e-6 + 1e-5 |weight|), the share of the tests' float32
tolerance used (at most 1 passes). The big batch's own time per update is
printed first.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging  # noqa: E402

import estimator_accum  # noqa: E402
from data import bert_features, classification  # noqa: E402
from harness import bench, support  # noqa: E402
from models import console  # noqa: E402
from models.bert import (  # noqa: E402
  classifier,
  modeling,
  pretrained,
  tokenization,
)

EFFECTIVE = 32
SEQ_LENGTH = 128
LEARNING_RATE = 1e-4
DEFAULT_BUDGETS = {"minilm": [3000, 1600, 1000, 850],
                   "bert_small": [3000, 1600, 1250, 1100, 950]}


def _config(name, checkpoint):
  if name == "minilm":
    config = modeling.BertConfig.from_json_file(checkpoint.bert_config_file)
  else:
    config = modeling.BertConfig(
        vocab_size=30522, hidden_size=512, num_hidden_layers=4,
        num_attention_heads=8, intermediate_size=2048)
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
  return config


def _features(checkpoint, directory):
  processor = classification.get_processor("rotten_tomatoes")
  examples = processor.get_train_examples(None)[:EFFECTIVE * 40]
  tokenizer = tokenization.FullTokenizer(checkpoint.vocab_file, True)
  path = os.path.join(directory, "train-128.tf_record")
  bert_features.cached_tfrecord(examples, processor.get_labels(), SEQ_LENGTH,
                                tokenizer, path)
  return path


class Setup:
  """One model on the features file: builds its steps in fresh graphs."""

  def __init__(self, name, checkpoint, features):
    self.name, self.features = name, features
    self.config = _config(name, checkpoint)
    self.init = checkpoint.init_checkpoint if name == "minilm" else None
    self.start = None  # The initial weights, the same for every run.

  def loss(self, micro_batch):
    dataset = bert_features.input_fn_builder(
        self.features, SEQ_LENGTH, micro_batch, is_training=False,
        drop_remainder=True, trim=False)()
    features = tf.compat.v1.data.make_one_shot_iterator(
        dataset.repeat()).get_next()
    logits, _ = classifier.create_model(self.config, True, features, 2,
                                        classifier_dropout=0.0)
    if self.init:
      mapping, _ = modeling.get_assignment_map_from_checkpoint(
          tf.compat.v1.trainable_variables(), self.init)
      tf.compat.v1.train.init_from_checkpoint(self.init, mapping)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=features["label_ids"], logits=logits))

  def accumulating_step(self, micro_batch, k):
    tf.compat.v1.train.get_or_create_global_step()
    return estimator_accum.build_accumulating_train_op(
        self.loss(micro_batch), tf.compat.v1.train.AdamOptimizer(
            LEARNING_RATE), k)

  def plain_step(self, micro_batch, k):
    del k
    return tf.compat.v1.train.AdamOptimizer(LEARNING_RATE).minimize(
        self.loss(micro_batch),
        tf.compat.v1.train.get_or_create_global_step())

  def train(self, step, micro_batch, k, updates):
    """(seconds per update after a warm-up window, final weights): the
    timed windows go on from the warm-up's weights, so a second session
    trains `updates` windows from the start for the weights."""
    graph = tf.Graph()
    with graph.as_default():
      train_op = step(micro_batch, k)
      init = tf.compat.v1.global_variables_initializer()
      trainable = tf.compat.v1.trainable_variables()
    seconds = None
    for timed in (True, False):
      with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        if self.start is None:
          self.start = session.run({v.op.name: v for v in trainable})
        support.load_variables(session, {
            v: self.start[v.op.name] for v in trainable})
        if timed:
          for _ in range(k):
            session.run(train_op)
          began = time.perf_counter()
        for _ in range(updates * k):
          session.run(train_op)
        if timed:
          seconds = (time.perf_counter() - began) / updates
        else:
          weights = session.run({v.op.name: v for v in trainable})
    return seconds, weights


def _difference(weights, reference):
  """(largest absolute difference, the largest |difference| / (1e-6 +
  1e-5 |reference|): at most 1 is within the tests' float32 tolerance)."""
  absolute = max(float(np.max(np.abs(weights[n] - reference[n])))
                 for n in reference)
  ratio = max(float(np.max(np.abs(weights[n] - reference[n]) /
                           (1e-6 + 1e-5 * np.abs(reference[n]))))
              for n in reference)
  return absolute, ratio


def run_model(name, budgets, updates, checkpoint, features, json_path):
  setup = Setup(name, checkpoint, features)
  big_seconds, big_weights = setup.train(setup.plain_step, EFFECTIVE, 1,
                                         updates)
  peak = "peak MB (every candidate measured)"
  rows = bench.Rows(
      f"\n{name}: effective batch {EFFECTIVE}, {SEQ_LENGTH} tokens; plain "
      f"Adam on the big batch: {big_seconds:.2f} s/update (BFC allocator "
      "on CPU, as a GPU holds tensors)", json_path, markdown=True,
      formats={"planning s": ".1f", "s/update": ".2f",
               "max abs weight diff": ".1e", "of tolerance": ".2f"})
  for budget in budgets:
    try:
      plan = estimator_accum.plan_micro_batch(
          setup.accumulating_step, EFFECTIVE, memory_budget_mb=budget)
    except ValueError as error:
      rows.add(**{"budget MB": budget, "chosen": f"none: {error}", peak: "",
                  "planning s": "", "s/update": "",
                  "max abs weight diff": "", "of tolerance": ""})
      continue
    chosen = next(m for m in plan.measurements
                  if m.micro_batch == plan.micro_batch)
    seconds, weights = setup.train(setup.accumulating_step, plan.micro_batch,
                                   plan.k, updates)
    measured = ", ".join(
        f"{m.micro_batch}: {'OOM' if m.peak_bytes is None else round(m.peak_bytes / 2**20)}"
        for m in plan.measurements)
    absolute, ratio = _difference(weights, big_weights)
    rows.add(**{"budget MB": budget,
                "chosen": f"{plan.micro_batch} x k={plan.k}",
                peak: f"{chosen.peak_bytes / 2**20:.0f} ({measured})",
                "planning s": plan.planning_seconds, "s/update": seconds,
                "max abs weight diff": absolute, "of tolerance": ratio})
    if ratio > 1:
      rows.fail(f"{name} at {budget} MB: weights {ratio:.2f} of the "
                "tolerance from the big batch's")
  return rows


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--models", nargs="+", default=["minilm", "bert_small"],
                      choices=sorted(DEFAULT_BUDGETS))
  parser.add_argument("--budgets", nargs="+", type=float, default=None,
                      help="MB; default per model")
  parser.add_argument("--updates", type=int, default=3)
  parser.add_argument("--workdir", default="/tmp/plan_memory")
  args = parser.parse_args()
  console.quiet_tensorflow(False)
  logging.set_verbosity(logging.WARNING)
  tf.compat.v1.disable_eager_execution()
  checkpoint = pretrained.minilm_checkpoint()
  os.makedirs(args.workdir, exist_ok=True)
  features = _features(checkpoint, args.workdir)
  failed = 0
  for name in args.models:
    failed |= run_model(name, args.budgets or DEFAULT_BUDGETS[name],
                        args.updates, checkpoint, features,
                        args.json).exit_code()
  return failed


if __name__ == "__main__":
  sys.exit(main())
