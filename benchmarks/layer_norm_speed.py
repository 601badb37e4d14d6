"""The BERT layer norm as `models.bert` writes it against `tf.nn.moments`.

`models.bert.modeling.normalize_last_axis` centres once and takes the mean
square of the centred values; the moments formulation takes `tf.nn.moments` (a
`SquaredDifference` against the mean) and then subtracts the mean again.
The moments one kills the process in a plain Session forward pass with
oneDNN on (docs/troubleshooting.md), so in inference it can only run with
Grappler's remapper off; the centred one runs both ways, and is timed both
ways.

Side by side in one process, interleaved round by round, on the MiniLM
encoder's shape (6 layers, hidden 384, 12 heads) with random weights:

  inference   sequence output of a batch, no backward pass
  training    forward, backward and an SGD update

Prints the median ms per step of each variant and the ratio against the
moments formulation in the same mode.

  python benchmarks/layer_norm_speed.py [--batch 8] [--seq 128] [--rounds 15]
"""

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import rewriter_config_pb2  # noqa: E402

from harness import bench  # noqa: E402
from harness.session_steps import SessionSteps, interleave  # noqa: E402
from models.bert import modeling  # noqa: E402

tf.compat.v1.disable_eager_execution()

MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
              num_attention_heads=12, intermediate_size=1536,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def moments_normalization(inputs, epsilon):
  """Google's layer norm written with tf.nn.moments (dies forward-only)."""
  mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)
  return (inputs - mean) * tf.math.rsqrt(variance + epsilon)


FORMULATIONS = {"moments": moments_normalization,
                "centred": modeling.normalize_last_axis}


def _config(remapper):
  config = tf.compat.v1.ConfigProto()
  if not remapper:
    config.graph_options.rewrite_options.remapping = (
        rewriter_config_pb2.RewriterConfig.OFF)
  return config


def _variant(formulation, training, remapper, batch, seq):
  """One graph and session: a formulation, a mode, the remapper on or off."""
  name = (f"{'training' if training else 'inference'} {formulation}"
          f"{'' if remapper else ' (remapper off)'}")
  graph = tf.Graph()
  rng = np.random.RandomState(0)
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    ids = tf.constant(rng.randint(0, 30522, (batch, seq)), tf.int32)
    saved = modeling.normalize_last_axis
    modeling.normalize_last_axis = FORMULATIONS[formulation]
    try:
      model = modeling.BertModel(modeling.BertConfig(**MINILM), training, ids)
    finally:
      modeling.normalize_last_axis = saved
    output = model.get_sequence_output()
    if training:
      loss = tf.reduce_mean(tf.square(output))
      fetch = tf.compat.v1.train.GradientDescentOptimizer(1e-4).minimize(loss)
    else:
      fetch = tf.reduce_sum(output)
    init = tf.compat.v1.global_variables_initializer()
  return SessionSteps(name, graph, fetch, init, _config(remapper))


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps_per_round", type=int, default=2)
  args = parser.parse_args()
  variants = [
      # Forward only, the moments formulation cannot run with the remapper
      # on (the process dies): it runs with it off.
      _variant("moments", False, False, args.batch, args.seq),
      _variant("centred", False, True, args.batch, args.seq),
      _variant("centred", False, False, args.batch, args.seq),
      _variant("moments", True, True, args.batch, args.seq),
      _variant("centred", True, True, args.batch, args.seq),
  ]
  interleave(variants, args.rounds, args.steps_per_round)
  rows = bench.Rows(
      f"MiniLM shape, batch {args.batch} x {args.seq} tokens, "
      f"{args.rounds} rounds x {args.steps_per_round} steps, interleaved; "
      f"{tf.__version__}, oneDNN "
      f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default (on)')}",
      args.json, formats={"median ms": ".1f"})
  baseline = {}
  for variant in variants:
    median = statistics.median(variant.times) * 1e3
    mode = variant.name.split()[0]
    baseline.setdefault(mode, median)
    rows.add(**{"variant": variant.name, "median ms": median,
                "vs moments": f"{median / baseline[mode]:.3f}x"})
  rows.print()
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
