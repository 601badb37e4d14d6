"""The exact GELU as `models.bert` writes it (the formula, its gradient
left to autodiff) against one with its derivative written out
(`tf.custom_gradient`: Phi(x) + x * phi(x), reusing Phi; 7 element-wise ops
in the backward pass where autodiff's took about twice as many).

Side by side in one process, interleaved round by round, on the MiniLM
encoder's shape (6 layers, hidden 384, intermediate 1536, 12 heads; dropout
on, as in training) with random weights: one step is the forward pass, the
backward pass and an SGD update, at the main job's usual micro-batch of
sorted sentences (8 x 28 tokens). Prints the median ms per step of each
variant, the ratio against autodiff's, and the largest difference between
the two variants' gradients (relative to the largest gradient).

  python benchmarks/gelu_speed.py [--batch 8] [--seq 28] [--rounds 20]
"""

import math
import os
import statistics
import sys
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import bench  # noqa: E402
from harness.session_steps import SessionSteps, interleave  # noqa: E402
from models.bert import modeling  # noqa: E402

tf.compat.v1.disable_eager_execution()

MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
              num_attention_heads=12, intermediate_size=1536)


@tf.custom_gradient
def written_out_gelu(x):
  """x * Phi(x), its gradient dy * (Phi(x) + x * phi(x))."""
  cdf = 0.5 * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0))))

  def grad(dy):
    pdf = tf.exp(-0.5 * tf.square(x)) * (1.0 / math.sqrt(2.0 * math.pi))
    return dy * (cdf + x * pdf)

  return x * cdf, grad


VARIANTS = {"autodiff": modeling.get_activation("gelu"),
            "written out": written_out_gelu}


def _encoder_gradients(gelu, ids, dropout):
  """In the current graph: the MiniLM-shaped encoder on `ids` with `gelu`
  as its "gelu", a loss on its pooled output, and (gradients, variables)."""
  tf.compat.v1.set_random_seed(0)
  config = modeling.BertConfig(**MINILM)
  if not dropout:
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
  with mock.patch.dict(modeling._ACTIVATIONS, gelu=gelu):  # noqa: SLF001
    model = modeling.BertModel(config, True, tf.constant(ids, tf.int32))
  loss = tf.reduce_mean(tf.square(model.get_pooled_output()))
  variables = tf.compat.v1.trainable_variables()
  return tf.gradients(loss, variables), variables


def _training_step(name, ids):
  """The timed variant: forward, backward and an SGD update, dropout on."""
  graph = tf.Graph()
  with graph.as_default():
    gradients, variables = _encoder_gradients(VARIANTS[name], ids, True)
    fetch = tf.compat.v1.train.GradientDescentOptimizer(1e-4).apply_gradients(
        zip(gradients, variables))
    init = tf.compat.v1.global_variables_initializer()
  return SessionSteps(name, graph, fetch, init)


def _gradients_apart(ids):
  """The two GELUs' gradients of one loss at the same weights, without
  dropout: the largest difference over the largest gradient."""
  values = []
  for gelu in VARIANTS.values():
    with tf.Graph().as_default():
      gradients, _ = _encoder_gradients(gelu, ids, False)
      dense = [tf.convert_to_tensor(g) for g in gradients]  # the table's
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values.append(session.run(dense))
  a, b = values
  largest = max(float(np.max(np.abs(g))) for g in a)
  return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) / largest


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=28)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--steps_per_round", type=int, default=5)
  args = parser.parse_args()
  ids = np.random.RandomState(0).randint(1000, 30000, (args.batch, args.seq))
  variants = [_training_step(name, ids) for name in VARIANTS]
  interleave(variants, args.rounds, args.steps_per_round)
  apart = _gradients_apart(ids)
  rows = bench.Rows(
      f"MiniLM shape, training steps of {args.batch} x {args.seq} tokens, "
      f"{args.rounds} rounds x {args.steps_per_round} steps, interleaved; "
      f"{tf.__version__}, oneDNN "
      f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}; gradients "
      f"apart by {apart:.1e} of the largest",
      args.json, formats={"median ms": ".1f"})
  baseline = statistics.median(variants[0].times)
  for variant in variants:
    median = statistics.median(variant.times)
    rows.add(**{"gelu": variant.name, "median ms": median * 1e3,
                "speed-up": f"{baseline / median:.3f}x"})
  if apart > 1e-5:
    rows.fail(f"the gradients are {apart:.1e} apart, over 1e-5")
  rows.print()
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
