"""Small BERT folders in Hugging Face's layout, written by the tests."""

import json
import os

import numpy as np
from safetensors.numpy import save_file

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "film", "movie", "good", "great", "fun", "bad", "dull",
         "awful", "and", "is", "was", "not", "very", "plot", "acting", ",",
         ".", "!", "##s", "##ly"]


def write_tiny_hf_bert(model_dir, hidden=16, layers=2, heads=2,
                       intermediate=32, positions=64, seed=0,
                       words=WORDS):
  """Writes config.json, vocab.txt and model.safetensors of a random BERT
  with Hugging Face's names and PyTorch's [out, in] kernel layout."""
  os.makedirs(model_dir, exist_ok=True)
  vocab = SPECIAL + list(words)
  with open(os.path.join(model_dir, "vocab.txt"), "w") as writer:
    writer.write("\n".join(vocab) + "\n")
  config = {"model_type": "bert", "vocab_size": len(vocab),
            "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "intermediate_size": intermediate,
            "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": positions, "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12}
  with open(os.path.join(model_dir, "config.json"), "w") as writer:
    json.dump(config, writer)
  rng = np.random.default_rng(seed)

  def normal(*shape):
    return rng.normal(0.0, 0.2, shape).astype(np.float32)

  weights = {
      "embeddings.word_embeddings.weight": normal(len(vocab), hidden),
      "embeddings.position_embeddings.weight": normal(positions, hidden),
      "embeddings.token_type_embeddings.weight": normal(2, hidden),
      "embeddings.LayerNorm.weight": 1.0 + normal(hidden),
      "embeddings.LayerNorm.bias": normal(hidden),
      "embeddings.position_ids": np.arange(positions)[None].astype(np.int64),
      "pooler.dense.weight": normal(hidden, hidden),
      "pooler.dense.bias": normal(hidden),
      "cls.predictions.bias": normal(len(vocab)),
  }
  shapes = {"attention.self.query": (hidden, hidden),
            "attention.self.key": (hidden, hidden),
            "attention.self.value": (hidden, hidden),
            "attention.output.dense": (hidden, hidden),
            "intermediate.dense": (intermediate, hidden),
            "output.dense": (hidden, intermediate)}
  for index in range(layers):
    prefix = f"encoder.layer.{index}."
    for part, shape in shapes.items():
      weights[prefix + part + ".weight"] = normal(*shape)
      weights[prefix + part + ".bias"] = normal(shape[0])
    for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
      weights[prefix + norm + ".weight"] = 1.0 + normal(hidden)
      weights[prefix + norm + ".bias"] = normal(hidden)
  save_file(weights, os.path.join(model_dir, "model.safetensors"))
  return config, weights
