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
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import bench  # noqa: E402
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


class Variant:
  """One graph and session: the encoder with one GELU."""

  def __init__(self, name, batch, seq):
    self.name = name
    self.graph = tf.Graph()
    rng = np.random.RandomState(0)
    with self.graph.as_default():
      tf.compat.v1.set_random_seed(0)
      ids = tf.constant(rng.randint(1000, 30000, (batch, seq)), tf.int32)
      saved = modeling._ACTIVATIONS["gelu"]  # noqa: SLF001
      modeling._ACTIVATIONS["gelu"] = VARIANTS[name]  # noqa: SLF001
      try:
        model = modeling.BertModel(modeling.BertConfig(**MINILM), True, ids)
      finally:
        modeling._ACTIVATIONS["gelu"] = saved  # noqa: SLF001
      loss = tf.reduce_mean(tf.square(model.get_pooled_output()))
      variables = tf.compat.v1.trainable_variables()
      self.gradients = tf.gradients(loss, variables)
      self.fetch = tf.compat.v1.train.GradientDescentOptimizer(
          1e-4).apply_gradients(zip(self.gradients, variables))
      init = tf.compat.v1.global_variables_initializer()
    self.session = tf.compat.v1.Session(graph=self.graph)
    self.session.run(init)
    self.session.run(self.fetch)  # Grappler and first-run allocation.
    self.times = []

  def step(self):
    start = time.perf_counter()
    self.session.run(self.fetch)
    self.times.append(time.perf_counter() - start)


def _gradients_apart(batch, seq):
  """The two GELUs' gradients of one loss at the same weights, without
  dropout: the largest difference over the largest gradient."""
  rng = np.random.RandomState(1)
  ids = rng.randint(1000, 30000, (batch, seq))
  values = {}
  for name, gelu in VARIANTS.items():
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(0)
      saved = modeling._ACTIVATIONS["gelu"]  # noqa: SLF001
      modeling._ACTIVATIONS["gelu"] = gelu  # noqa: SLF001
      try:
        model = modeling.BertModel(modeling.BertConfig(
            **MINILM, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0), True,
            tf.constant(ids, tf.int32))
      finally:
        modeling._ACTIVATIONS["gelu"] = saved  # noqa: SLF001
      loss = tf.reduce_mean(tf.square(model.get_pooled_output()))
      gradients = [tf.convert_to_tensor(g) for g in tf.gradients(
          loss, tf.compat.v1.trainable_variables())]  # the table's dense
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values[name] = session.run(gradients)
  a, b = values.values()
  largest = max(float(np.max(np.abs(g))) for g in a)
  return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) / largest


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=28)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--steps_per_round", type=int, default=5)
  args = parser.parse_args()
  variants = [Variant(name, args.batch, args.seq) for name in VARIANTS]
  for _ in range(args.rounds):
    for variant in variants:
      for _ in range(args.steps_per_round):
        variant.step()
  apart = _gradients_apart(args.batch, args.seq)
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
