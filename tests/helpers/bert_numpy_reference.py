"""An independent BERT forward pass in numpy, straight from Hugging Face
safetensors weights (PyTorch layout and names), for comparing the project's
TensorFlow model and checkpoint conversion against. It shares no code with
`models/`.
"""

import math

import numpy as np

_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _layer_norm(x, weight, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * weight + bias


def _linear(x, weights, name):
  return x @ weights[name + ".weight"].astype(np.float64).T + weights[
      name + ".bias"]


def bert_hidden_states(weights, config, input_ids, attention_mask,
                       token_type_ids):
  """Returns (last hidden states [B, T, H], pooled [B, H]) in float64."""
  outputs = bert_layer_outputs(weights, config, input_ids, attention_mask,
                               token_type_ids)
  return outputs["sequence_output"], outputs["pooled_output"]


def bert_layer_outputs(weights, config, input_ids, attention_mask,
                       token_type_ids):
  """Returns a dict of float64 arrays: embedding_output [B, T, H],
  encoder_layers (a list, one [B, T, H] per layer), sequence_output
  [B, T, H] and pooled_output [B, H]."""
  w = {name: value.astype(np.float64) for name, value in weights.items()
       if value.dtype.kind == "f"}
  w = {name[len("bert."):] if name.startswith("bert.") else name: value
       for name, value in w.items()}
  eps = config["layer_norm_eps"]
  heads = config["num_attention_heads"]
  batch, length = input_ids.shape
  x = (w["embeddings.word_embeddings.weight"][input_ids] +
       w["embeddings.position_embeddings.weight"][np.arange(length)][None] +
       w["embeddings.token_type_embeddings.weight"][token_type_ids])
  x = _layer_norm(x, w["embeddings.LayerNorm.weight"],
                  w["embeddings.LayerNorm.bias"], eps)
  embedding_output, encoder_layers = x, []
  bias = (1.0 - attention_mask[:, None, None, :]) * -10000.0
  head_size = x.shape[-1] // heads
  for index in range(config["num_hidden_layers"]):
    p = f"encoder.layer.{index}."

    def split(t):
      return t.reshape(batch, length, heads, head_size).transpose(0, 2, 1, 3)

    q, k, v = (split(_linear(x, w, p + "attention.self." + part))
               for part in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_size) + bias
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
    attention = _layer_norm(
        _linear(context, w, p + "attention.output.dense") + x,
        w[p + "attention.output.LayerNorm.weight"],
        w[p + "attention.output.LayerNorm.bias"], eps)
    hidden = _linear(attention, w, p + "intermediate.dense")
    hidden = 0.5 * hidden * (1.0 + _ERF(hidden / math.sqrt(2.0)))
    x = _layer_norm(_linear(hidden, w, p + "output.dense") + attention,
                    w[p + "output.LayerNorm.weight"],
                    w[p + "output.LayerNorm.bias"], eps)
    encoder_layers.append(x)
  pooled = np.tanh(_linear(x[:, 0], w, "pooler.dense"))
  return {"embedding_output": embedding_output,
          "encoder_layers": encoder_layers, "sequence_output": x,
          "pooled_output": pooled}
