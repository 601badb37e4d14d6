"""Converts a Hugging Face BERT folder into a Google-style BERT checkpoint.

    python -m models.bert.convert_hf --model_dir D --output_dir O

reads `D/config.json`, `D/model.safetensors` and `D/vocab.txt` and writes
`O/bert_config.json`, `O/vocab.txt` and `O/bert_model.ckpt.{index,data-*}`
with google-research/bert's variable names, which `run_classifier.py
--init_checkpoint O/bert_model.ckpt` (or Google's own code) loads.

Dense kernels are transposed (PyTorch stores [out, in], TensorFlow [in, out]).
Pre-training heads (`cls.*`) and `position_ids` buffers are not part of the
encoder and are left out; anything else not recognised is an error rather than
a silently missing weight.
"""

import json
import os
import re
import shutil
import sys

import numpy as np
import tensorflow as tf
from absl import app, flags, logging
from safetensors.numpy import load_file

from models.bert import modeling

# Hugging Face activation names → ours ("gelu" is the exact erf GELU in both).
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "tanh": "tanh"}
_IGNORED = re.compile(r"^(cls\.|.*position_ids$)")
_LAYER_PARTS = {
    "attention.self.query": "attention/self/query",
    "attention.self.key": "attention/self/key",
    "attention.self.value": "attention/self/value",
    "attention.output.dense": "attention/output/dense",
    "attention.output.LayerNorm": "attention/output/LayerNorm",
    "intermediate.dense": "intermediate/dense",
    "output.dense": "output/dense",
    "output.LayerNorm": "output/LayerNorm",
}
_TOP_PARTS = {
    "embeddings.word_embeddings": "embeddings/word_embeddings",
    "embeddings.position_embeddings": "embeddings/position_embeddings",
    "embeddings.token_type_embeddings": "embeddings/token_type_embeddings",
    "embeddings.LayerNorm": "embeddings/LayerNorm",
    "pooler.dense": "pooler/dense",
}
_LEAVES = {"weight": "kernel", "bias": "bias", "gamma": "gamma",
           "beta": "beta"}


def google_name(hf_name):
  """The Google variable name of a Hugging Face BERT weight, and whether its
  value must be transposed; None for weights that are not the encoder's."""
  name = hf_name[len("bert."):] if hf_name.startswith("bert.") else hf_name
  if _IGNORED.match(name):
    return None
  module, _, leaf = name.rpartition(".")
  layer = re.match(r"encoder\.layer\.(\d+)\.(.+)$", module)
  if layer:
    part = _LAYER_PARTS.get(layer.group(2))
    prefix = f"bert/encoder/layer_{layer.group(1)}/"
  else:
    part = _TOP_PARTS.get(module)
    prefix = "bert/"
  if part is None or leaf not in _LEAVES:
    raise ValueError(f"model.safetensors has weight {hf_name!r}, which is not "
                     f"part of a BERT encoder this converter knows.")
  if part.endswith("LayerNorm"):
    leaf = {"weight": "gamma", "bias": "beta"}.get(leaf, leaf)
    return prefix + part + "/" + leaf, False
  if part.endswith("embeddings"):
    return prefix + part, False
  return prefix + part + "/" + _LEAVES[leaf], leaf == "weight"


def bert_config_from_hf(hf_config):
  """A BertConfig from a Hugging Face config.json dict."""
  model_type = hf_config.get("model_type", "bert")
  if model_type != "bert":
    raise ValueError(f"config.json has model_type={model_type!r}; only 'bert' "
                     f"models convert.")
  act = hf_config.get("hidden_act", "gelu")
  if act not in _ACTIVATIONS:
    raise ValueError(f"config.json has hidden_act={act!r}; supported: "
                     f"{sorted(_ACTIVATIONS)}.")
  embedding_type = hf_config.get("position_embedding_type", "absolute")
  if embedding_type != "absolute":
    raise ValueError(f"config.json has position_embedding_type="
                     f"{embedding_type!r}; only 'absolute' converts.")
  return modeling.BertConfig.from_dict(
      dict(hf_config, hidden_act=_ACTIVATIONS[act]))


def convert(model_dir, output_dir):
  """Writes output_dir/{bert_config.json,vocab.txt,bert_model.ckpt.*}.

  Returns the checkpoint prefix (output_dir/bert_model.ckpt).
  """
  paths = {name: os.path.join(model_dir, name)
           for name in ("config.json", "model.safetensors", "vocab.txt")}
  for name, path in paths.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"model_dir {model_dir!r} has no {name}.")
  with open(paths["config.json"]) as reader:
    config = bert_config_from_hf(json.load(reader))
  names, values = [], []
  for hf_name, value in sorted(load_file(paths["model.safetensors"]).items()):
    target = google_name(hf_name)
    if target is None:
      logging.info("convert_hf: leaving out %s (not part of the encoder)",
                   hf_name)
      continue
    name, transpose = target
    names.append(name)
    values.append(np.ascontiguousarray(
        value.T if transpose else value).astype(np.float32))
  _check_complete(names, config)
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "bert_config.json"), "w") as writer:
    writer.write(config.to_json_string())
  shutil.copyfile(paths["vocab.txt"], os.path.join(output_dir, "vocab.txt"))
  prefix = os.path.join(output_dir, "bert_model.ckpt")
  with tf.device("/cpu:0"):
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=values)
  return prefix


def _check_complete(names, config):
  """Raises ValueError if the encoder's weights are not all there."""
  expected = {"bert/embeddings/word_embeddings",
              "bert/embeddings/position_embeddings",
              "bert/embeddings/token_type_embeddings",
              "bert/embeddings/LayerNorm/gamma"}
  expected.update(f"bert/encoder/layer_{index}/output/dense/kernel"
                  for index in range(config.num_hidden_layers))
  missing = sorted(expected - set(names))
  if missing:
    raise ValueError(f"model.safetensors lacks encoder weights: "
                     f"{', '.join(missing)}.")


def main(argv):
  del argv
  try:
    prefix = convert(flags.FLAGS.model_dir, flags.FLAGS.output_dir)
  except (OSError, ValueError) as error:
    sys.exit(f"convert_hf: {error}")
  print(f"wrote {prefix} (+ bert_config.json, vocab.txt)")


if __name__ == "__main__":
  flags.DEFINE_string("model_dir", None,
                      "Hugging Face BERT folder: config.json, "
                      "model.safetensors, vocab.txt.")
  flags.DEFINE_string("output_dir", None, "Where to write the checkpoint.")
  flags.mark_flags_as_required(["model_dir", "output_dir"])
  app.run(main)
