"""Cost of accumulation per micro-batch, and the memory it adds.

For each model, these graphs are built from the same network and data:

  fwd_bwd  the forward and backward pass alone (tf.gradients, nothing applied)
  plain    plain training at the same micro-batch (minimize)
  accum    build_accumulating_train_op(loss, optimizer, k)
  accum_step  the same with a window that never ends: only the per-micro-batch
           accumulation, without the amortized apply
  opt_apply  the optimizer's apply alone, of one micro-batch's gradients kept
           in variables: what any training pays per update, accumulating or
           not

They are timed side by side, interleaved micro-batch by micro-batch (for
each micro-batch of a window, one run of every variant in turn, so a drift
of this shared machine's speed moves them together, and the apply steps
are included at their real frequency). Printed: the median over windows
of accum / fwd_bwd and accum / plain; what accumulation itself costs, as
accumulate step / fwd_bwd and as (accum - opt_apply / k) / fwd_bwd (the
window's time without the optimizer's own update, per micro-batch); and the
accumulator state in bytes against the trainable variables.

  python benchmarks/accumulation_overhead.py        # mlp, bert_small, minilm
  python benchmarks/accumulation_overhead.py --models mlp --rounds 3
  python benchmarks/accumulation_overhead.py --memory     # peak RSS instead
  python benchmarks/accumulation_overhead.py --memory --models mlp mlp_4096

With --memory each variant runs two windows in a process of its own and the
peak resident memory while training (VmHWM from the first micro-batch on,
everything built and initialized before included) of each is printed, with
the difference between accumulating and plain training against the
trainable variables, and how much of that difference is the accumulators
and how much the larger graph (its Python and C++ objects, measured after
building it and before any tensor exists). The child processes run with glibc's mmap threshold fixed
(see peak_memory.MALLOC_ENV), so a freed tensor goes back to the system and
the peak is the memory live at once, reproducible to a few MB.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import bench  # noqa: E402
from harness.memory import (  # noqa: E402
  MALLOC_ENV,
  PeakMemory,
  status_mb,
)
from models.bert import modeling  # noqa: E402

VARIANTS = ("fwd_bwd", "plain", "accum", "accum_step", "opt_apply")
MEMORY_VARIANTS = ("fwd_bwd", "plain", "accum", "accum_step")
_CONTROL_FLOW_V1 = False
OPTIMIZERS = {
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-4),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(1e-4),
}


def mlp_loss(seed=0, batch_size=64, width=1024):
  """An MLP (3.2M parameters at width 1024) on random 1024-d inputs."""
  rng = np.random.RandomState(seed)
  inputs = tf.constant(rng.normal(size=(batch_size, 1024)).astype(np.float32))
  labels = tf.constant(rng.randint(0, 10, size=batch_size).astype(np.int32))
  hidden = inputs
  for index in range(3):
    hidden = tf.compat.v1.layers.dense(hidden, width, tf.nn.relu,
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


def bert_base_loss(seed=0, batch_size=8, seq_length=128):
  """BERT-Base's shape (L=12, H=768, 109M parameters)."""
  return bert_small_loss(seed, batch_size, seq_length, modeling.BertConfig(
      vocab_size=30522, hidden_size=768, num_hidden_layers=12,
      num_attention_heads=12, intermediate_size=3072))


MODELS = {"mlp": mlp_loss, "bert_small": bert_small_loss,
          "minilm": minilm_loss, "bert_base": bert_base_loss,
          # The MLP's graph with 4x and 16x the bytes: memory that grows
          # with the variables' size, against memory that grows with the graph.
          "mlp_2048": lambda: mlp_loss(width=2048),
          "mlp_4096": lambda: mlp_loss(width=4096)}


def _stored_gradients(loss):
  """One micro-batch's gradients kept in variables.

  Returns (pairs, capture): (gradient, variable) pairs reading the stored
  gradients (tf.IndexedSlices where the gradient is sparse), and the op that
  stores the current micro-batch's gradients, to run once after init.
  """
  variables = tf.compat.v1.trainable_variables()
  pairs, capture = [], []
  for gradient, variable in zip(tf.compat.v1.gradients(loss, variables),
                                variables):
    if gradient is None:
      continue
    parts = ([gradient.values, gradient.indices]
             if isinstance(gradient, tf.IndexedSlices) else [gradient])
    stored = []
    for part in parts:
      holder = tf.compat.v1.Variable(tf.zeros(part.shape, part.dtype),
                                     trainable=False)
      capture.append(holder.assign(part, read_value=False))
      stored.append(holder.read_value())
    if isinstance(gradient, tf.IndexedSlices):
      stored = tf.IndexedSlices(stored[0], stored[1], gradient.dense_shape)
    else:
      stored = stored[0]
    pairs.append((stored, variable))
  return pairs, tf.group(*capture)


def build_graph(model_name, variant, k, optimizer_name="adam"):
  """Returns (graph, train_op, trainable bytes, accumulator bytes, setup).

  `setup` lists the ops to run once after the variables' initializer.
  """
  graph = tf.Graph()
  setup = [tf.compat.v1.global_variables_initializer]
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
    elif variant == "opt_apply":
      pairs, capture = _stored_gradients(loss)
      train_op = optimizer.apply_gradients(pairs)
      setup.append(lambda: capture)
    else:
      # The largest k a window takes (2**24): it never ends in this run.
      window = k if variant == "accum" else 2**24
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
    setup = [make() for make in setup]
  return graph, train_op, trainable, accumulators, setup


def build(model_name, variant, k, optimizer_name="adam", threads=None):
  """Returns (session, train_op, trainable bytes, accumulator bytes); the
  session on `threads` threads (inter- and intra-op), default TensorFlow's."""
  graph, train_op, trainable, accumulators, setup = build_graph(
      model_name, variant, k, optimizer_name)
  config = None
  if threads is not None:
    config = estimator_accum.own_threads(tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=threads,
        intra_op_parallelism_threads=threads))
  session = tf.compat.v1.Session(graph=graph, config=config)
  for op in setup:
    session.run(op)
  return session, train_op, trainable, accumulators


def seconds_per_micro_batch(session, train_op, micro_batches):
  start = time.perf_counter()
  for _ in range(micro_batches):
    session.run(train_op)
  return (time.perf_counter() - start) / micro_batches


def run(model_name, k, rounds, windows_per_round, optimizer_name):
  """Times every variant micro-batch by micro-batch, interleaved: for each
  micro-batch of a window, one run of each variant in turn. A window's
  figures (each variant's k micro-batches) then come from the same few
  seconds of this shared machine, and the ratios are taken per window
  (median over `rounds * windows_per_round` windows)."""
  built = {variant: build(model_name, variant, k, optimizer_name)
           for variant in VARIANTS}
  for session, train_op, _, _ in built.values():
    seconds_per_micro_batch(session, train_op, k)  # warm-up, one window
  windows = {variant: [] for variant in VARIANTS}
  for _ in range(rounds * windows_per_round):
    window = {variant: 0.0 for variant in VARIANTS}
    for _ in range(k):
      for variant in VARIANTS:
        session, train_op, _, _ = built[variant]
        window[variant] += seconds_per_micro_batch(session, train_op, 1)
    for variant in VARIANTS:
      windows[variant].append(window[variant] / k)
  per_window = lambda a, b: [x / y for x, y in zip(windows[a], windows[b])]  # noqa: E731
  _, _, trainable, accumulators = built["accum"]
  for session, _, _, _ in built.values():
    session.close()
  return {
      "model": model_name,
      "k": k,
      "ms_fwd_bwd": 1e3 * statistics.median(windows["fwd_bwd"]),
      "ms_plain": 1e3 * statistics.median(windows["plain"]),
      "ms_accum": 1e3 * statistics.median(windows["accum"]),
      "accum_over_fwd_bwd": statistics.median(per_window("accum", "fwd_bwd")),
      "accum_over_plain": statistics.median(per_window("accum", "plain")),
      "step_over_fwd_bwd": statistics.median(per_window("accum_step",
                                                        "fwd_bwd")),
      "ms_opt_apply": 1e3 * statistics.median(windows["opt_apply"]),
      # The window without the optimizer's own update, per micro-batch.
      "own_over_fwd_bwd": statistics.median([
          (accum - apply / k) / pass_
          for accum, apply, pass_ in zip(windows["accum"],
                                         windows["opt_apply"],
                                         windows["fwd_bwd"])]),
      "trainable_mb": trainable / 2**20,
      "accumulator_mb": accumulators / 2**20,
  }


def child_memory(model_name, variant, k, optimizer_name):
  """Runs `variant` for two windows in a fresh process.

  Returns {"peak": peak RSS MB, "graph": MB the graph took to build,
  "trainable": MB of trainable variables, "accumulators": MB of state}.
  """
  output = subprocess.run(
      [sys.executable, __file__, "--models", model_name, "--k", str(k),
       "--optimizer", optimizer_name, "--peak-rss-of", variant]
      + (["--control_flow_v1"] if _CONTROL_FLOW_V1 else []),
      capture_output=True, text=True, check=True,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               **MALLOC_ENV))
  return json.loads(output.stdout.strip().splitlines()[-1])


def measure_memory(model_names, k, optimizer_name, json_path=None):
  rows = bench.Rows("peak resident memory (glibc malloc, MB)", json_path,
                    markdown=True, formats=dict.fromkeys(
                        ("trainable MB", "accumulators MB"), ".1f") | {
                            "(accum - plain)/trainable": ".2f"})
  for model_name in model_names:
    memory = {v: child_memory(model_name, v, k, optimizer_name)
              for v in MEMORY_VARIANTS}
    peaks = {v: round(m["peak"]) for v, m in memory.items()}
    trainable_mb = memory["accum"]["trainable"]
    accumulators_mb = memory["accum"]["accumulators"]
    extra = peaks["accum"] - peaks["plain"]
    rows.add(**{
        "model": model_name, "trainable MB": trainable_mb,
        "accumulators MB": accumulators_mb,
        "peak MB fwd+bwd": peaks["fwd_bwd"], "peak MB plain": peaks["plain"],
        "peak MB accum": peaks["accum"],
        "peak MB accumulate steps only": peaks["accum_step"],
        "accum - plain MB": extra,
        "(accum - plain)/trainable": extra / trainable_mb,
        "accum - plain - accumulators MB": round(extra - accumulators_mb),
        "accum - fwd+bwd - accumulators MB": round(
            peaks["accum"] - peaks["fwd_bwd"] - accumulators_mb),
        "graph objects, accum - plain MB": round(
            memory["accum"]["graph"] - memory["plain"]["graph"])})
  return rows


def _memory_of_one_variant(model_name, variant, k, optimizer_name):
  """In this process: builds, runs two windows, prints the JSON figures."""
  before = status_mb("VmRSS")
  graph, train_op, trainable, accumulators, setup = build_graph(
      model_name, variant, k, optimizer_name)
  # The graph is complete and no tensor exists yet: its own memory.
  graph_mb = status_mb("VmRSS") - before
  # One thread: ops run in one order, so transients overlap the same way in
  # every run (with two threads the peak moved by up to 60 MB).
  config = estimator_accum.own_threads(tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=1, intra_op_parallelism_threads=1))
  with tf.compat.v1.Session(graph=graph, config=config) as session:
    for op in setup:
      session.run(op)
    # The peak while training: the initializers' own transients (random
    # numbers for a 64 MB variable, say) are not the training's.
    with PeakMemory():
      seconds_per_micro_batch(session, train_op, 2 * k)
  print(json.dumps({"peak": status_mb("VmHWM"), "graph": graph_mb,
                    "trainable": trainable / 2**20,
                    "accumulators": accumulators / 2**20}))


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--models", nargs="+",
                      default=["mlp", "bert_small", "minilm"],
                      choices=list(MODELS))
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                      default="adam")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--windows-per-round", type=int, default=2)
  parser.add_argument("--control_flow_v1", action="store_true",
                      help="build every graph with control flow v1")
  parser.add_argument("--memory", action="store_true",
                      help="measure peak resident memory instead of time")
  parser.add_argument("--peak-rss-of", choices=MEMORY_VARIANTS,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.control_flow_v1:
    global _CONTROL_FLOW_V1
    _CONTROL_FLOW_V1 = True
    tf.compat.v1.disable_control_flow_v2()
  if args.peak_rss_of:
    _memory_of_one_variant(args.models[0], args.peak_rss_of, args.k,
                           args.optimizer)
    return 0
  if args.memory:
    return measure_memory(args.models, args.k, args.optimizer,
                          args.json).exit_code()
  rows = bench.Rows(
      f"machine: {platform.machine()}, {os.cpu_count()} cores, TensorFlow "
      f"{tf.__version__}, optimizer {args.optimizer}", args.json,
      markdown=True, formats=dict.fromkeys(
          ("ms fwd+bwd", "ms plain", "ms optimizer apply alone", "ms accum",
           "trainable MB", "accum MB"), ".1f"))
  for model_name in args.models:
    result = run(model_name, args.k, args.rounds, args.windows_per_round,
                 args.optimizer)
    rows.add(**{
        "model": result["model"], "k": result["k"],
        "ms fwd+bwd": result["ms_fwd_bwd"], "ms plain": result["ms_plain"],
        "ms optimizer apply alone": result["ms_opt_apply"],
        "ms accum": result["ms_accum"],
        "accum/fwd+bwd": result["accum_over_fwd_bwd"],
        "accum/plain": result["accum_over_plain"],
        "accumulate step/fwd+bwd": result["step_over_fwd_bwd"],
        "(accum - apply/k)/fwd+bwd": result["own_over_fwd_bwd"],
        "trainable MB": result["trainable_mb"],
        "accum MB": result["accumulator_mb"],
        "accum/trainable": (result["accumulator_mb"] /
                            result["trainable_mb"])})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
