"""Cost of accumulation per micro-batch, and the memory it adds.

For each model, three graphs are built from the same network and data:

  fwd_bwd  the forward and backward pass alone (tf.gradients, nothing applied)
  plain    plain training at the same micro-batch (Adam, minimize)
  accum    build_accumulating_train_op(loss, Adam, k)
  accum_step  the same with a window that never ends: only the per-micro-batch
           accumulation, without the amortized apply

They are timed side by side in interleaved rounds (each round runs every
variant for the same number of micro-batches, a multiple of k, so the apply
steps are included at their real frequency). Printed: the median over rounds
of accum / fwd_bwd and accum / plain, and the accumulator state in bytes
against the trainable variables.

  python benchmarks/accumulation_overhead.py                  # both models
  python benchmarks/accumulation_overhead.py --models mlp --rounds 3
  python benchmarks/accumulation_overhead.py --memory     # peak RSS instead

With --memory each variant runs two windows in a process of its own and the
peak resident memory (ru_maxrss) of each is printed, with the difference
between accumulating and plain training against the trainable variables.
"""

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from models.bert import modeling  # noqa: E402

VARIANTS = ("fwd_bwd", "plain", "accum", "accum_step")
OPTIMIZERS = {
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-4),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(1e-4),
}


def mlp_loss(seed=0, batch_size=64):
  """An MLP of 3.2M parameters on a batch of random 1024-d inputs."""
  rng = np.random.RandomState(seed)
  inputs = tf.constant(rng.normal(size=(batch_size, 1024)).astype(np.float32))
  labels = tf.constant(rng.randint(0, 10, size=batch_size).astype(np.int32))
  hidden = inputs
  for index in range(3):
    hidden = tf.compat.v1.layers.dense(hidden, 1024, tf.nn.relu,
                                       name=f"dense_{index}")
  logits = tf.compat.v1.layers.dense(hidden, 10, name="logits")
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def bert_small_loss(seed=0, batch_size=8, seq_length=128, config=None):
  """BERT-Small (L=4, H=512, 28.8M parameters) classifying random tokens."""
  rng = np.random.RandomState(seed)
  config = config or modeling.BertConfig(
      vocab_size=30522, hidden_size=512, num_hidden_layers=4,
      num_attention_heads=8, intermediate_size=2048)
  ids = tf.constant(rng.randint(0, config.vocab_size,
                                size=(batch_size, seq_length)).astype(np.int32))
  labels = tf.constant(rng.randint(0, 2, size=batch_size).astype(np.int32))
  model = modeling.BertModel(config, True, ids)
  logits = tf.compat.v1.layers.dense(model.get_pooled_output(), 2,
                                     name="classifier")
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def minilm_loss(seed=0, batch_size=8, seq_length=128):
  """all-MiniLM-L6-v2's shape (L=6, H=384, 22.7M parameters)."""
  return bert_small_loss(seed, batch_size, seq_length, modeling.BertConfig(
      vocab_size=30522, hidden_size=384, num_hidden_layers=6,
      num_attention_heads=12, intermediate_size=1536))


MODELS = {"mlp": mlp_loss, "bert_small": bert_small_loss,
          "minilm": minilm_loss}


def build(model_name, variant, k, optimizer_name="adam"):
  """Returns (session, train_op, state bytes) for one variant."""
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    loss = MODELS[model_name]()
    optimizer = OPTIMIZERS[optimizer_name]()
    if variant == "fwd_bwd":
      gradients = tf.compat.v1.gradients(
          loss, tf.compat.v1.trainable_variables())
      # Fetch one element of each gradient: a tf.group of stateless tensors
      # is pruned by Grappler, and the element still needs the whole tensor.
      first = lambda t: tf.reshape(t, [-1])[0]  # noqa: E731
      parts = []
      for gradient in gradients:
        if isinstance(gradient, tf.IndexedSlices):
          parts += [first(gradient.values), tf.cast(first(gradient.indices),
                                                    tf.float32)]
        else:
          parts.append(first(gradient))
      train_op = tf.add_n(parts)
    elif variant == "plain":
      train_op = optimizer.minimize(
          loss, tf.compat.v1.train.get_or_create_global_step())
    else:
      window = k if variant == "accum" else 2**62
      train_op = estimator_accum.build_accumulating_train_op(
          loss, optimizer, window, summaries=False)
    trainable = sum(v.shape.num_elements() * v.dtype.size
                    for v in tf.compat.v1.trainable_variables())
    accumulators = 0
    if variant == "accum":
      state = estimator_accum.get_accumulation_state(graph)
      for accumulator in state.accumulators:
        for variable in (accumulator.total, accumulator.rows):
          if variable is not None:
            accumulators += variable.shape.num_elements() * variable.dtype.size
    session = tf.compat.v1.Session(graph=graph)
    session.run(tf.compat.v1.global_variables_initializer())
  return session, train_op, trainable, accumulators


def seconds_per_micro_batch(session, train_op, micro_batches):
  start = time.perf_counter()
  for _ in range(micro_batches):
    session.run(train_op)
  return (time.perf_counter() - start) / micro_batches


def run(model_name, k, rounds, windows_per_round, optimizer_name):
  built = {variant: build(model_name, variant, k, optimizer_name)
           for variant in VARIANTS}
  micro_batches = k * windows_per_round
  for session, train_op, _, _ in built.values():
    seconds_per_micro_batch(session, train_op, k)  # warm-up, one window
  times = {variant: [] for variant in VARIANTS}
  for _ in range(rounds):
    for variant in VARIANTS:
      session, train_op, _, _ = built[variant]
      times[variant].append(
          seconds_per_micro_batch(session, train_op, micro_batches))
  per_round = lambda a, b: [x / y for x, y in zip(times[a], times[b])]  # noqa: E731
  _, _, trainable, accumulators = built["accum"]
  for session, _, _, _ in built.values():
    session.close()
  return {
      "model": model_name,
      "k": k,
      "ms_fwd_bwd": 1e3 * statistics.median(times["fwd_bwd"]),
      "ms_plain": 1e3 * statistics.median(times["plain"]),
      "ms_accum": 1e3 * statistics.median(times["accum"]),
      "accum_over_fwd_bwd": statistics.median(per_round("accum", "fwd_bwd")),
      "accum_over_plain": statistics.median(per_round("accum", "plain")),
      "step_over_fwd_bwd": statistics.median(per_round("accum_step",
                                                       "fwd_bwd")),
      "trainable_mb": trainable / 2**20,
      "accumulator_mb": accumulators / 2**20,
  }


def peak_rss_mb(model_name, variant, k, optimizer_name):
  """Runs `variant` for two windows in a fresh process; returns its peak RSS."""
  output = subprocess.run(
      [sys.executable, __file__, "--models", model_name, "--k", str(k),
       "--optimizer", optimizer_name, "--peak-rss-of", variant], capture_output=True, text=True, check=True,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
  return float(output.stdout.strip().splitlines()[-1])


def measure_memory(model_names, k, optimizer_name):
  print("model | k | peak MB fwd+bwd | peak MB plain | peak MB accum | "
        "peak MB accumulate steps only | accum - plain MB | trainable MB | "
        "(accum - plain)/trainable")
  for model_name in model_names:
    peaks = {v: peak_rss_mb(model_name, v, k, optimizer_name)
             for v in VARIANTS}
    _, _, trainable, _ = build(model_name, "fwd_bwd", k)
    trainable_mb = trainable / 2**20
    extra = peaks["accum"] - peaks["plain"]
    print(f"{model_name} | {k} | {peaks['fwd_bwd']:.0f} | {peaks['plain']:.0f}"
          f" | {peaks['accum']:.0f} | {peaks['accum_step']:.0f} | {extra:.0f} | "
          f"{trainable_mb:.1f} | "
          f"{extra / trainable_mb:.2f}", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", nargs="+", default=list(MODELS),
                      choices=list(MODELS))
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                      default="adam")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--windows-per-round", type=int, default=2)
  parser.add_argument("--memory", action="store_true",
                      help="measure peak resident memory instead of time")
  parser.add_argument("--peak-rss-of", choices=VARIANTS,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.peak_rss_of:
    session, train_op, _, _ = build(args.models[0], args.peak_rss_of, args.k,
                                    args.optimizer)
    seconds_per_micro_batch(session, train_op, 2 * args.k)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return
  if args.memory:
    measure_memory(args.models, args.k, args.optimizer)
    return
  print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"TensorFlow {tf.__version__}, optimizer {args.optimizer}")
  header = ("model", "k", "ms fwd+bwd", "ms plain", "ms accum",
            "accum/fwd+bwd", "accum/plain", "accumulate step/fwd+bwd",
            "trainable MB", "accum MB",
            "accum/trainable")
  print(" | ".join(header))
  for model_name in args.models:
    result = run(model_name, args.k, args.rounds, args.windows_per_round,
                 args.optimizer)
    print(" | ".join([
        result["model"], str(result["k"]),
        f"{result['ms_fwd_bwd']:.1f}", f"{result['ms_plain']:.1f}",
        f"{result['ms_accum']:.1f}", f"{result['accum_over_fwd_bwd']:.3f}",
        f"{result['accum_over_plain']:.3f}",
        f"{result['step_over_fwd_bwd']:.3f}", f"{result['trainable_mb']:.1f}",
        f"{result['accumulator_mb']:.1f}",
        f"{result['accumulator_mb'] / result['trainable_mb']:.3f}"]),
        flush=True)


if __name__ == "__main__":
  main()
