"""The window's end against its floor, the memory traffic of reading and
writing the parameters, the optimizer's slots and the accumulators once.

The main job's model's variables (all-MiniLM-L6-v2: their shapes read from
its checkpoint, 22.7M parameters, every gradient dense), BERT's
AdamWeightDecay with clipping at 1.0, k=2, on a loss that costs next to
nothing (the sum of each variable times a constant), so that a step is
the window's own work. In one run:

  accumulate   a micro-batch that adds into the accumulators (median)
  end          an applying micro-batch's time minus an accumulating one's:
               the mean, the norm, the clip, the optimizer, the zeroing
  floor        the bytes an end must move, read p, m, v and the
               accumulators, write p, m, v and the zeroed accumulators (8 x 4
               bytes a parameter), at the bandwidth measured here (a 256 MB
               variable times a constant into another: read + write)
  peak         the applying micro-batch's peak tensor memory above what was
               in use before it (the BFC allocator, which holds tensors as a
               GPU does: TF_CPU_ALLOCATOR_USE_BFC=true)

each with TensorFlow's ops (`one_pass=False`), with `fused_apply=True`
(XLA compiles the whole apply into one function, which updates the
variables in place) and with AdamWeightDecay's one native pass a variable
(the default on the CPU: `EaAdamWeightDecay`, in place, no compile), and
how far apart the runs' weights are after the same updates (the one pass
and TensorFlow's ops bit for bit, or the benchmark fails, where the
gradients are dense).

With `--sparse_embedding`, the word embeddings' gradient is a lookup's, as
in the main job (tf.IndexedSlices: each micro-batch looks up 2,048 token
ids of the vocabulary, the window's rows accumulated as rows): BERT's
AdamWeightDecay applies it as the dense gradient its rows sum to, which
fused_apply then hands it, so that the whole apply still compiles as one
function.

With `--trace`, one applying micro-batch of each is traced (RunMetadata)
and its op types printed by the time their ops took (summed over ops: two
that overlap both count), the largest first: where the end's time goes.

  python benchmarks/window_end.py [--repeats 20] [--trace] [--sparse_embedding]
"""

import collections
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import bench  # noqa: E402
from models.bert import optimization, pretrained  # noqa: E402

COPY_FLOATS = 64 * 2**20  # 256 MB


def _median_seconds(session, op, repeats):
  times = []
  for _ in range(repeats):
    started = time.perf_counter()
    session.run(op)
    times.append(time.perf_counter() - started)
  return float(np.median(times))


def _copy_bandwidth(repeats):
  """Bytes a second one assign moves (reads one variable, writes another)."""
  with tf.Graph().as_default():
    source = tf.compat.v1.get_variable(
        "source", initializer=tf.random.normal([COPY_FLOATS]))
    target = tf.compat.v1.get_variable(
        "target", initializer=tf.zeros([COPY_FLOATS]))
    # One pass: the product reads the source and writes a new buffer, which
    # the assign takes as the target's (no copy). (A factor of 1 or an
    # added 0 Grappler removes, and the assign of the source itself
    # shares its buffer.)
    copy = target.assign(source * 1.0001, read_value=False)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(copy)
      return 2 * COPY_FLOATS * 4 / _median_seconds(session, copy, repeats)


def _traced_step(session, op):
  """{op type: milliseconds its ops took} of one run of `op`."""
  metadata = tf.compat.v1.RunMetadata()
  session.run(op, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
              run_metadata=metadata)
  took = collections.Counter()
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      label = node.timeline_label
      kind = label.split(" = ")[1].split("(")[0] if " = " in label else "?"
      took[kind] += node.all_end_rel_micros / 1e3
  return took


LOOKUPS = 2048  # token ids a micro-batch looks up (--sparse_embedding)


def _window_steps(shapes, repeats, fused, one_pass, trace=False,
                  sparse=None):
  """(accumulating step, applying step) median seconds, the applying step's
  peak bytes above those in use before it, and the weights after. The
  variable at index `sparse` (if any) gets its gradient from a lookup."""
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(0)  # the same start, fused or not
    rng = np.random.RandomState(0)
    variables, terms = [], []
    step = tf.compat.v1.train.get_or_create_global_step()
    for index, shape in enumerate(shapes):
      variable = tf.compat.v1.get_variable(
          f"bert/v{index}", shape,
          initializer=tf.compat.v1.random_normal_initializer(0.0, 0.02))
      variables.append(variable)
      if index == sparse:
        # Each micro-batch its own ids (Zipf-like, as tokens are).
        ids = tf.constant(np.minimum(rng.zipf(1.3, (2, LOOKUPS)) - 1,
                                     shape[0] - 1).astype(np.int32))
        looked_up = tf.gather(variable, tf.gather(ids, step % 2))
        scale = tf.constant(rng.normal(0.0, 1.0, (LOOKUPS, shape[1])).astype(
            np.float32))
        terms.append(tf.reduce_sum(looked_up * scale))
        continue
      scale = tf.constant(rng.normal(0.0, 1.0, shape).astype(np.float32))
      terms.append(tf.reduce_sum(variable * scale))
    loss = tf.add_n(terms)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimization.AdamWeightDecayOptimizer(
            1e-5, weight_decay_rate=0.01,
            exclude_from_weight_decay=list(
                optimization.DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY),
            one_pass=one_pass), 2, clip_norm=1.0, fused_apply=fused)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      start = session.run(variables)
      for _ in range(4):
        session.run(train_op)
      accumulate, apply = [], []
      for _ in range(repeats):
        for times in (accumulate, apply):
          started = time.perf_counter()
          session.run(train_op)
          times.append(time.perf_counter() - started)
      traced = None
      if trace:
        session.run(train_op)  # accumulates
        traced = _traced_step(session, train_op)  # applies
      session.run(train_op)  # accumulates (an even count ran before)
      tf.config.experimental.reset_memory_stats("CPU:0")
      before = tf.config.experimental.get_memory_info("CPU:0")["current"]
      session.run(train_op)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
      weights = session.run(variables)
  moved = max(float(np.max(np.abs(w - s))) for w, s in zip(weights, start))
  return (float(np.median(accumulate)), float(np.median(apply)), peak,
          (weights, moved), traced)


def main():
  parser = bench.parser(__doc__, repeats=20)
  parser.add_argument("--trace", action="store_true",
                      help="print where an applying micro-batch's time goes")
  parser.add_argument("--sparse_embedding", action="store_true",
                      help="the word embeddings' gradient from a lookup "
                      "(tf.IndexedSlices), as in the main job")
  args = parser.parse_args()
  checkpoint = pretrained.minilm_checkpoint()
  named = [(name, shape) for name, shape in
           tf.train.list_variables(checkpoint.init_checkpoint)
           if name.startswith("bert/")]
  shapes = [shape for _, shape in named]
  sparse = ([name for name, _ in named].index(
      "bert/embeddings/word_embeddings") if args.sparse_embedding else None)
  parameters = sum(int(np.prod(shape)) for shape in shapes)
  bandwidth = _copy_bandwidth(args.repeats)
  floor = 8 * 4 * parameters / bandwidth
  rows = bench.Rows(
      f"the window's end, all-MiniLM-L6-v2's {parameters / 1e6:.1f}M "
      f"parameters"
      f"{' (word embeddings: a lookup, sparse)' if args.sparse_embedding else ''}"
      f", AdamWeightDecay, clip 1.0, k=2; copy bandwidth "
      f"{bandwidth / 1e9:.1f} GB/s; peak: BFC allocator", args.json,
      markdown=True, formats={"ms": ".1f", "x floor": ".2f",
                              "peak MB": ".0f"})
  weights = {}
  kinds = {"TensorFlow's ops": (False, False),
           "fused_apply (XLA)": (True, False),
           "one native pass (the default)": (True, True)}
  for apply_kind, (fused, one_pass) in kinds.items():
    accumulate, apply, peak, weights[apply_kind], traced = _window_steps(
        shapes, args.repeats, fused, one_pass, args.trace, sparse)
    if traced:
      print(f"an applying micro-batch, {apply_kind}, traced: " + ", ".join(
          f"{kind} {ms:.1f} ms" for kind, ms in traced.most_common(8)),
            flush=True)
    rows.add(part=f"accumulate (a micro-batch's window work), {apply_kind}",
             ms=accumulate * 1e3, **{"x floor": accumulate / floor,
                                     "peak MB": ""})
    rows.add(part=f"end (apply step minus accumulate step), {apply_kind}",
             ms=(apply - accumulate) * 1e3,
             **{"x floor": (apply - accumulate) / floor,
                "peak MB": peak / 2**20})
  rows.add(part="floor (8 x 4 bytes a parameter at copy bandwidth)",
           ms=floor * 1e3, **{"x floor": 1.0, "peak MB": ""})
  plain, moved = weights.pop("TensorFlow's ops")
  for apply_kind, (weights_of, _) in weights.items():
    worst = max(float(np.max(np.abs(a - b)))
                for a, b in zip(plain, weights_of))
    print(f"weights after {args.repeats + 3} updates, {apply_kind} against "
          f"TensorFlow's ops: at most {worst:.1e} apart, "
          f"{worst / moved:.1e} of the most any weight moved ({moved:.1e})")
  # The one pass computes TensorFlow's ops' values: bit for bit, or this
  # benchmark fails. (Not with --sparse_embedding: the lookup's repeated
  # rows are added into the table's sums in an order that varies from run
  # to run, TensorFlow's ops against themselves too.)
  one_pass, _ = weights["one native pass (the default)"]
  identical = args.sparse_embedding or all(
      np.array_equal(a, b) for a, b in zip(plain, one_pass))
  if not identical:
    print("FAILED: the one native pass's weights are not TensorFlow's ops' "
          "bit for bit")
  return rows.exit_code() or (0 if identical else 1)


if __name__ == "__main__":
  sys.exit(main())
