"""The main job's micro-batch step with its dense layers or its keyed dropout
written other ways, side by side in one process.

The model is the main job's: MiniLM's shape (6 layers, hidden 384,
intermediate 1536, 12 heads) with random weights, unpadded, the last layer
for [CLS] only, dropout keyed by example. One step is the forward pass, the
backward pass and an add of each gradient into an accumulator (a
micro-batch's work between two window ends), over micro-batches of 8
sentences at several lengths (`--lengths`, as sorted windows give them;
each sentence's real length drawn from the upper half). The variants take
turns round by round, so a busier minute of this shared machine falls on
each alike: ±1-2% where whole runs of the job move by ±5%.

`--dense`: each dense layer as `models.bert` writes it (`tf.tensordot`,
then `+ bias`), as a matrix product then `+ bias` (which Grappler's
remapper fuses into one `_MklNativeFusedMatMul`; the Reshape of tensordot
keeps it from that), and as a matrix product then `tf.nn.bias_add` (fused
too; the bias's gradient is then `BiasAddGrad`, not a `Sum`).

`--dropout`: keyed dropout in TensorFlow's own ops
(`tf.where(keep, scaled, zeros_like(scaled))`, `one_pass=False`), in the
native kernel that makes the same masks in one pass (the default where it
builds: `estimator_accum.native`), with a scalar zero in
place of the zeros tensor, as a multiply by the mask (`inputs * keep *
scale`), and without dropout (a ceiling on what any dropout could save,
not a choice: the masks are part of the job). The masks are the same in
all but the last.

`--gelu`: the exact GELU in TensorFlow's own ops (five passes forward,
seven backward) and in the native kernel's one pass each way (the default
in a training graph where it builds: `estimator_accum.native`), and
without the GELU (a ceiling).

`--normalize`: the layer norms' normalization in TensorFlow's own ops
(eight passes forward) and in the native kernel (three each way: the
default in a training graph where it builds), and without it (a ceiling;
`* gamma + beta` kept in all three).

`--ceilings`: what fused kernels for the element-wise blocks could save at
most: the step without the layer norms' normalization (`* gamma + beta`
kept), without the GELU, without dropout, and without all three. None is
the same function; each is a bound on what any kernel computing that block
(it must still read and write its tensor) could gain.

Prints the median ms a step of each variant, the ratio against the first,
and, for each variant that computes the same function, the largest
difference of its gradients from the first's (relative to the largest
gradient; over 1e-5 fails).

  python benchmarks/step_variants.py --dense|--dropout|--gelu|--normalize|
      --ceilings
      [--rounds 15]
      [--lengths 20,24,28,32,40,48,64]
"""

import contextlib
import functools
import os
import statistics
import sys
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the main job's path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from estimator_accum.window import keyed_dropout  # noqa: E402
from harness import bench  # noqa: E402
from harness.session_steps import interleave  # noqa: E402
from models.bert import modeling  # noqa: E402

tf.compat.v1.disable_eager_execution()

MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
              num_attention_heads=12, intermediate_size=1536)
MICRO_BATCH = 8


def _matrix_dense(add_bias):
  """A dense layer as one matrix product of the rows, then `add_bias`."""
  def dense(inputs, units, name, initializer_range, activation=None):
    kernel, bias = modeling.dense_variables(inputs, units, name,
                                           initializer_range)
    rows = inputs if inputs.shape.rank == 2 else tf.reshape(
        inputs, [-1, inputs.shape[-1]])
    output = add_bias(tf.matmul(rows, kernel), bias)
    if inputs.shape.rank != 2:
      output = tf.reshape(
          output, tf.concat([tf.shape(inputs)[:-1], [units]], 0))
      output.set_shape(inputs.shape[:-1].concatenate([units]))
    return activation(output) if activation else output
  return dense


def _scalar_zero(inputs, rate, keys, *, seed=0, site):
  if not rate:
    return inputs
  scale = tf.cast(1.0 / (1.0 - rate), inputs.dtype)
  return tf.where(keyed_dropout.keep_mask(inputs, rate, keys, seed=seed,
                                            site=site), inputs * scale,
                  tf.constant(0, inputs.dtype))


def _mask_multiply(inputs, rate, keys, *, seed=0, site):
  if not rate:
    return inputs
  scale = tf.cast(1.0 / (1.0 - rate), inputs.dtype)
  return inputs * (tf.cast(keyed_dropout.keep_mask(
      inputs, rate, keys, seed=seed, site=site), inputs.dtype) * scale)


def _no_dropout(inputs, rate, keys, *, seed=0, site):
  del rate, keys, seed, site
  return inputs


# name: (what is patched, its replacement, computes the same function)
DENSE = {
    "tensordot + bias (models.bert)": ("_dense", modeling._dense, True),  # noqa: SLF001
    "matmul + bias (fused forward)": (
        "_dense", _matrix_dense(lambda x, b: x + b), True),
    "matmul, bias_add (fused, BiasAddGrad)": (
        "_dense", _matrix_dense(tf.nn.bias_add), True),
}
DROPOUT = {
    "where(keep, x, zeros_like) (TensorFlow's ops)": (
        "keyed_dropout", functools.partial(keyed_dropout.keyed_dropout,
                                           one_pass=False), True),
    "one pass (estimator_accum.native, the default)": (
        "keyed_dropout", keyed_dropout.keyed_dropout, True),
    "where(keep, x, 0)": ("keyed_dropout", _scalar_zero, True),
    "x * mask": ("keyed_dropout", _mask_multiply, True),
    "no dropout (a ceiling)": ("keyed_dropout", _no_dropout, False),
}


GELU = {
    "TensorFlow's ops": ("gelu", modeling._gelu_ops, True),  # noqa: SLF001
    "one pass (estimator_accum.native, the default)": (
        "gelu", modeling.gelu_exact, True),
    "no GELU (a ceiling)": ("gelu", lambda inputs: inputs, False),
}


def _no_normalization(inputs, epsilon, one_pass=False):
  del epsilon, one_pass
  return inputs


_NORMALIZE = modeling.normalize_last_axis
NORMALIZE = {
    "TensorFlow's ops": (
        "normalize", lambda inputs, epsilon, one_pass=False: _NORMALIZE(
            inputs, epsilon, one_pass=False), True),
    "three passes (estimator_accum.native, the default)": (
        "normalize", _NORMALIZE, True),
    "no normalization (a ceiling)": ("normalize", _no_normalization, False),
}


def _no_activation(inputs):
  return inputs


# A ceiling's blocks left out: (where, name, replacement) each.
_LEFT_OUT = {
    "layer norm": (modeling, "normalize_last_axis", _no_normalization),
    "GELU": (modeling._ACTIVATIONS, "gelu", _no_activation),  # noqa: SLF001
    "dropout": (keyed_dropout, "keyed_dropout", _no_dropout),
}
CEILINGS = {
    "the main job's step": ("ceiling", (), True),
    "no layer norm (a ceiling)": ("ceiling", ("layer norm",), False),
    "no GELU (a ceiling)": ("ceiling", ("GELU",), False),
    "no dropout (a ceiling)": ("ceiling", ("dropout",), False),
    "none of the three (a ceiling)": (
        "ceiling", ("layer norm", "GELU", "dropout"), False),
}


@contextlib.contextmanager
def _left_out(blocks):
  with contextlib.ExitStack() as stack:
    for block in blocks:
      where, name, replacement = _LEFT_OUT[block]
      if isinstance(where, dict):
        stack.enter_context(mock.patch.dict(where, {name: replacement}))
      else:
        stack.enter_context(mock.patch.object(where, name, replacement))
    yield


def _patched(target, replacement):
  if target == "ceiling":
    return _left_out(replacement)
  if target == "_dense":
    return mock.patch.object(modeling, "_dense", replacement)
  if target == "normalize":
    return mock.patch.object(modeling, "normalize_last_axis", replacement)
  if target == "gelu":
    return mock.patch.dict(modeling._ACTIVATIONS, {"gelu": replacement})  # noqa: SLF001
  return mock.patch.object(keyed_dropout, "keyed_dropout", replacement)


def _feeds(lengths):
  """[(ids, mask)] a micro-batch each: 8 sentences padded to `length`,
  each one's real length drawn from the upper half."""
  state = np.random.RandomState(0)
  feeds = []
  for length in lengths:
    ids = state.randint(1000, 30000, (MICRO_BATCH, length)).astype(np.int32)
    mask = np.zeros((MICRO_BATCH, length), np.int32)
    for row, real in enumerate(state.randint(length // 2, length + 1,
                                             MICRO_BATCH)):
      mask[row, :max(real, 1)] = 1
    mask[0] = 1  # the micro-batch's longest fills its length
    feeds.append((ids, mask))
  return feeds


class _FeedSteps:
  """A variant's session; each `step()` runs its micro-batch once for
  every feed (`harness.session_steps.interleave` takes turns), its wall
  time in `times`."""

  def __init__(self, name, target, replacement, feeds):
    self.name, self.times = name, []
    graph = tf.Graph()
    with graph.as_default(), _patched(target, replacement):
      tf.compat.v1.set_random_seed(0)
      ids = tf.compat.v1.placeholder(tf.int32, [None, None])
      mask = tf.compat.v1.placeholder(tf.int32, [None, None])
      model = modeling.BertModel(
          modeling.BertConfig(**MINILM), True, ids, mask, unpadded=True,
          pooled_only=True,
          dropout_keys=tf.range(tf.shape(ids)[0], dtype=tf.int64),
          dropout_seed=3)
      loss = tf.reduce_mean(tf.square(model.get_pooled_output()))
      variables = tf.compat.v1.trainable_variables()
      self.gradients = [tf.convert_to_tensor(g)
                        for g in tf.gradients(loss, variables)]
      sums = [tf.Variable(tf.zeros(v.shape), trainable=False)
              for v in variables]
      self._add = tf.group(*[s.assign_add(g, read_value=False)
                             for s, g in zip(sums, self.gradients)])
      init = tf.compat.v1.global_variables_initializer()
    self._feeds = [{ids: i, mask: m} for i, m in feeds]
    self.session = tf.compat.v1.Session(graph=graph)
    self.session.run(init)
    self._run_all()  # Grappler's rewrite and the first allocations

  def _run_all(self):
    for feed in self._feeds:
      self.session.run(self._add, feed)

  def step(self):
    start = time.perf_counter()
    self._run_all()
    self.times.append(time.perf_counter() - start)

  def gradients_at_last(self):
    return self.session.run(self.gradients, self._feeds[-1])


def main():
  parser = bench.parser(__doc__)
  which = parser.add_mutually_exclusive_group(required=True)
  which.add_argument("--dense", action="store_true")
  which.add_argument("--dropout", action="store_true")
  which.add_argument("--gelu", action="store_true")
  which.add_argument("--normalize", action="store_true")
  which.add_argument("--ceilings", action="store_true")
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps_per_round", type=int, default=2)
  parser.add_argument("--lengths", default="20,24,28,32,40,48,64")
  args = parser.parse_args()
  lengths = [int(word) for word in args.lengths.split(",") if word.strip()]
  if not lengths or min(lengths) < 2 or max(lengths) > 512:
    parser.error(f"--lengths must be integers in [2, 512], got "
                 f"{args.lengths!r}")
  feeds = _feeds(lengths)
  variants = (DENSE if args.dense else DROPOUT if args.dropout else
              GELU if args.gelu else NORMALIZE if args.normalize else
              CEILINGS)
  steps = [_FeedSteps(name, target, replacement, feeds)
           for name, (target, replacement, _) in variants.items()]
  interleave(steps, args.rounds, args.steps_per_round)
  reference = steps[0].gradients_at_last()
  largest = max(float(np.max(np.abs(g))) for g in reference)
  rows = bench.Rows(
      f"the main job's micro-batch step (MiniLM's shape, unpadded, "
      f"pooled_only, keyed dropout), micro-batches of {MICRO_BATCH} x "
      f"{args.lengths} tokens, {args.rounds} rounds x "
      f"{args.steps_per_round} passes, interleaved; TensorFlow "
      f"{tf.__version__}, oneDNN {os.environ['TF_ENABLE_ONEDNN_OPTS']}",
      args.json, formats={"median ms a step": ".2f"})
  baseline = statistics.median(steps[0].times) / len(feeds)
  for step, (_, _, same) in zip(steps, variants.values()):
    median = statistics.median(step.times) / len(feeds)
    apart = None
    if same:
      apart = max(float(np.max(np.abs(a - b))) for a, b in
                  zip(step.gradients_at_last(), reference)) / largest
      if apart > 1e-5:
        rows.fail(f"{step.name}: gradients {apart:.1e} apart, over 1e-5")
    rows.add(**{"variant": step.name, "median ms a step": median * 1e3,
                "speed-up": f"{baseline / median:.3f}x",
                "gradients apart": ("another function" if apart is None
                                    else f"{apart:.1e}")})
  rows.print()
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
