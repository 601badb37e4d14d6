"""Runs one of the project's graphs forward only, in a plain Session.

`python -m tests.jobs.plain_session_job CASE [ARGS]` builds the graph on
placeholders, as a notebook, a serving script or Google's
`extract_features.py` would, runs it in `tf.compat.v1.Session()` with its
default configuration (oneDNN and every Grappler rewrite on), and prints one
JSON line of what it measured. A graph that TensorFlow's rewriters cannot
handle kills this process (a protobuf CHECK, then SIGSEGV), which is what
tests/integration/test_plain_session.py looks for: each case runs in a process of its
own.

Cases: bert_pretrained BERT_CONFIG INIT_CHECKPOINT HF_DIR, classifier, mnist,
housing, batch_norm, train_op, tf_layer_norms.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()


def _session():
  return tf.compat.v1.Session()  # The default configuration, on purpose.


def _max_difference(actual, expected):
  return float(np.abs(np.asarray(actual, np.float64) - expected).max())


def bert_pretrained(bert_config_file, init_checkpoint, hf_dir):
  """The encoder's every output against the numpy reference."""
  from safetensors.numpy import load_file

  from harness.texts import SENTENCES
  from models.bert import modeling, tokenization
  from tests.helpers import bert_numpy_reference

  tokenizer = tokenization.FullTokenizer(
      os.path.join(os.path.dirname(bert_config_file), "vocab.txt"), True)
  length = 24
  ids = np.zeros((len(SENTENCES), length), np.int32)
  for row, text in enumerate(SENTENCES):
    tokens = ["[CLS]"] + tokenizer.tokenize(text)[:length - 2] + ["[SEP]"]
    ids[row, :len(tokens)] = tokenizer.convert_tokens_to_ids(tokens)
  mask = (ids > 0).astype(np.int32)
  types = np.zeros_like(ids)
  input_ids, input_mask, segment_ids = (
      tf.compat.v1.placeholder(tf.int32, [None, None], name) for name in
      ("input_ids", "input_mask", "segment_ids"))
  model = modeling.BertModel(
      modeling.BertConfig.from_json_file(bert_config_file), False,
      input_ids, input_mask, segment_ids)
  tf.compat.v1.train.init_from_checkpoint(init_checkpoint, {"bert/": "bert/"})
  with open(os.path.join(hf_dir, "config.json")) as reader:
    config = json.load(reader)
  expected = bert_numpy_reference.bert_layer_outputs(
      load_file(os.path.join(hf_dir, "model.safetensors")), config, ids,
      mask.astype(np.float64), types)
  outputs = {
      "embedding_output": (model.get_embedding_output(),
                           expected["embedding_output"]),
      "sequence_output": (model.get_sequence_output(),
                          expected["sequence_output"]),
      "pooled_output": (model.get_pooled_output(), expected["pooled_output"]),
  }
  for index, layer in enumerate(model.get_all_encoder_layers()):
    outputs[f"encoder_layer_{index}"] = (layer,
                                         expected["encoder_layers"][index])
  feed = {input_ids: ids, input_mask: mask, segment_ids: types}
  report = {}
  with _session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    # One fetch at a time: each is its own pruned graph for Grappler.
    for name, (tensor, reference) in outputs.items():
      report[name] = _max_difference(session.run(tensor, feed), reference)
  return report


def classifier():
  """The classification head of run_classifier.py, for prediction."""
  from models.bert import classifier as bert_classifier
  from models.bert import modeling

  config = modeling.BertConfig(vocab_size=50, hidden_size=32,
                               num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64)
  features = {name: tf.compat.v1.placeholder(tf.int32, [None, 16], name)
              for name in ("input_ids", "input_mask", "segment_ids")}
  _, probabilities = bert_classifier.create_model(config, False, features, 3)
  rng = np.random.RandomState(0)
  feed = {features["input_ids"]: rng.randint(0, 50, (4, 16)),
          features["input_mask"]: np.ones((4, 16)),
          features["segment_ids"]: np.zeros((4, 16))}
  with _session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    values = session.run(probabilities, feed)
  return {"rows_sum_to_one": _max_difference(values.sum(-1), 1.0)}


def mnist():
  from models.mnist import model

  images = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1])
  spec = model.model_fn(images, None, tf.estimator.ModeKeys.PREDICT, {})
  with _session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    digits = session.run(spec.predictions["digit"],
                         {images: np.random.RandomState(0).rand(5, 28, 28, 1)})
  return {"predictions": len(digits)}


def housing():
  from models.housing import model

  features = tf.compat.v1.placeholder(tf.float32, [None, model.NUM_FEATURES])
  spec = model.model_fn(features, None, tf.estimator.ModeKeys.PREDICT, {})
  with _session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    prices = session.run(spec.predictions["price"],
                         {features: np.ones((3, model.NUM_FEATURES))})
  return {"initial_price": float(prices[0])}


def batch_norm():
  """The library's window batch norm, in inference and training mode,
  fetched without a backward pass, on NHWC images and on sequences."""
  import estimator_accum

  report = {}
  for rank, shape in ((4, [None, 6, 6, 8]), (3, [None, 5, 8])):
    for training in (False, True):
      with tf.Graph().as_default():
        inputs = tf.compat.v1.placeholder(tf.float32, shape)
        output = estimator_accum.batch_norm(inputs, training, k=2)
        values = np.random.RandomState(0).rand(4, *shape[1:])
        with _session() as session:
          session.run(tf.compat.v1.global_variables_initializer())
          result = session.run(output, {inputs: values})
        report[f"rank{rank}_training_{training}"] = float(np.abs(result).max())
  return report


def train_op():
  """The library's accumulating train op over a BERT encoder: the loss
  fetched alone (no backward pass), then micro-batches trained."""
  import estimator_accum
  from models.bert import modeling

  config = modeling.BertConfig(vocab_size=50, hidden_size=32,
                               num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
  ids = tf.compat.v1.placeholder(tf.int32, [None, 8])
  model = modeling.BertModel(config, True, ids)
  loss = tf.reduce_mean(tf.square(model.get_pooled_output()))
  tf.compat.v1.train.get_or_create_global_step()
  train = estimator_accum.build_accumulating_train_op(
      loss, tf.compat.v1.train.AdamOptimizer(1e-3), k=2)
  feed = {ids: np.random.RandomState(0).randint(0, 50, (4, 8))}
  with _session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    before = session.run(loss, feed)
    for _ in range(4):
      session.run(train, feed)
    after = session.run(loss, feed)
    step = session.run(tf.compat.v1.train.get_global_step())
  return {"loss_before": float(before), "loss_after": float(after),
          "global_step": int(step)}


def tf_layer_norms():
  """TensorFlow's own layer norms (Keras, tf-slim), fetched forward only."""
  import tf_slim

  report = {}
  values = np.random.RandomState(0).rand(2, 8, 16)
  for name in ("keras", "slim"):
    with tf.Graph().as_default():
      inputs = tf.compat.v1.placeholder(tf.float32, [None, None, 16])
      if name == "keras":
        output = tf.keras.layers.LayerNormalization(epsilon=1e-12)(inputs)
      else:
        output = tf_slim.layers.layer_norm(inputs, begin_norm_axis=-1,
                                           begin_params_axis=-1)
      with _session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        result = session.run(output, {inputs: values})
      mean = values.mean(-1, keepdims=True)
      expected = (values - mean) / np.sqrt(values.var(-1, keepdims=True) +
                                            1e-12)
      report[name] = _max_difference(result, expected)
  return report


CASES = {"bert_pretrained": bert_pretrained, "classifier": classifier,
         "mnist": mnist, "housing": housing, "batch_norm": batch_norm,
         "train_op": train_op, "tf_layer_norms": tf_layer_norms}


def main(argv):
  if len(argv) < 2 or argv[1] not in CASES:
    print(f"usage: python -m tests.jobs.plain_session_job {{{','.join(CASES)}}} "
          "[ARGS]", file=sys.stderr)
    return 2
  print(json.dumps({argv[1]: CASES[argv[1]](*argv[2:])}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
