"""Checks an exported classifier in a process of its own (for tests):

  python tests/jobs/serving_check.py EXPORT_PATH OUTPUT_DIR TASK DATA_DIR \
      MAX_SEQ_LENGTH BERT_CONFIG

Loads the SavedModel with `tf.saved_model.load`, runs `serving_default` on
the held-out features run_classifier.py wrote in OUTPUT_DIR
(features/dev-*.tf_record, made with models.bert.tokenization), runs the
`text` signature on the same examples' raw sentences, reads the ids the
text signature makes inside the exported graph, runs Estimator's predict on
OUTPUT_DIR's checkpoint (the library's session runner's where TensorFlow
has no Estimator), and prints one JSON line with all of them.
"""

import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401 (the text signature's ops)


def _features(output_dir, length):
  """(the dev features' file, {name: int32 [examples, length]})."""
  path = glob.glob(os.path.join(output_dir, "features", "dev-*.tf_record"))[0]
  schema = {name: tf.io.FixedLenFeature([length], tf.int64)
            for name in ("input_ids", "input_mask", "segment_ids")}
  rows = [tf.io.parse_single_example(r, schema)
          for r in tf.data.TFRecordDataset(path)]
  return path, {
      name: np.stack([r[name].numpy() for r in rows]).astype(np.int32)
      for name in schema}


def _estimator_predict(output_dir, bert_config_file, num_labels, path,
                       length):
  from data import bert_features  # noqa: PLC0415
  from estimator_accum import releases  # noqa: PLC0415
  from estimator_accum.estimator import (
    runner as session_runner,  # noqa: PLC0415
  )
  from models.bert import classifier, modeling  # noqa: PLC0415
  config = modeling.BertConfig.from_json_file(bert_config_file)
  model_fn = classifier.model_fn_builder(
      config, classifier.TrainingConfig(num_labels=num_labels))
  if releases.estimator() is None:
    estimator = session_runner.SessionEstimator(
        model_fn, session_runner.RunSettings(model_dir=output_dir))
  else:
    estimator = tf.estimator.Estimator(model_fn, model_dir=output_dir)
  return [p["probabilities"].tolist() for p in estimator.predict(
      bert_features.input_fn_builder(path, length, 3, is_training=False,
                                     drop_remainder=False))]


def main():
  export_path, output_dir, task, data_dir, length, bert_config = sys.argv[1:7]
  length = int(length)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  from data import classification  # noqa: PLC0415
  processor = classification.get_processor(task)
  examples = processor.get_dev_examples(data_dir or None)
  model = tf.saved_model.load(export_path)
  serving = model.signatures["serving_default"]
  path, features = _features(output_dir, length)
  by_ids = serving(**{k: tf.constant(v) for k, v in features.items()})
  # The same examples cut to their longest real length: any length serves.
  longest = int(features["input_mask"].sum(axis=1).max())
  short = serving(**{k: tf.constant(v[:, :longest])
                     for k, v in features.items()})
  pair = examples[0].text_b is not None
  strings = {"text": tf.constant([e.text_a for e in examples])}
  if pair:
    strings["text_b"] = tf.constant([e.text_b for e in examples])
  by_text = model.signatures["text"](**strings)
  # The ids the text signature makes, read from the exported graph itself.
  graph = tf.Graph()
  with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"],
                                                export_path)
    text_inputs = meta.signature_def["text"].inputs
    feed = {text_inputs[k].name: v.numpy() for k, v in strings.items()}
    names = meta.signature_def["serving_default"].inputs
    ids = session.run({k: names[k].name for k in names}, feed)
  print("RESULT " + json.dumps({
      "by_ids": by_ids["probabilities"].numpy().tolist(),
      "short": short["probabilities"].numpy().tolist(),
      "by_text": by_text["probabilities"].numpy().tolist(),
      "predict": _estimator_predict(output_dir, bert_config,
                                    len(processor.get_labels()), path, length),
      "graph_ids": {k: v.tolist() for k, v in ids.items()},
      "feature_ids": {k: v.tolist() for k, v in features.items()}}))


if __name__ == "__main__":
  main()
