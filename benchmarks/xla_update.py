"""Google's AdamWeightDecay update of one large variable, as TensorFlow's
elementwise ops (about ten passes over memory) and compiled by XLA into one
fused loop, side by side: the time of one update, its peak tensor memory
above what was in use before it (the BFC allocator, which holds tensors as
a GPU does), and each one's distance from the same update in float64 after
`--steps` updates (the fused loop rounds differently, not worse).

XLA three ways, in graph mode: `xla.compile`; ops marked with a jit scope,
as `fused_apply` marks each variable's update (TensorFlow's clustering
runs them by XlaCompile and XlaRun, which never update a variable in
place: "locking variables in XlaCompile and unlocking them in XlaRun may
lead to deadlocks", tensorflow/compiler/jit/kernels/xla_ops.cc); and a
`tf.function(jit_compile=True)` that assigns the variables itself, which
runs as one XlaLaunch, whose compiled update may write the variables'
buffers in place.

The variable is MiniLM's word-embedding table's size (30522 x 384); the
window's end applies this update to every trained variable.

  python benchmarks/xla_update.py [--repeats 10] [--steps 10]
"""

import contextlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.compiler.xla import xla  # noqa: E402

from harness import bench  # noqa: E402

tf.get_logger().setLevel("ERROR")  # (xla.compile says it is deprecated)

SIZE = 30522 * 384
LR, BETA_1, BETA_2, EPSILON, DECAY = 1e-3, 0.9, 0.999, 1e-6, 0.01


def _update(p, m, v, g):
  """google-research/bert's AdamWeightDecay step: no bias correction."""
  next_m = BETA_1 * m + (1.0 - BETA_1) * g
  next_v = BETA_2 * v + (1.0 - BETA_2) * tf.square(g)
  step = next_m / (tf.sqrt(next_v) + EPSILON) + DECAY * p
  return p - LR * step, next_m, next_v


def _reference(start, steps):
  p, m, v, g = (start[n].astype(np.float64) for n in "pmvg")
  for _ in range(steps):
    m = BETA_1 * m + (1 - BETA_1) * g
    v = BETA_2 * v + (1 - BETA_2) * g * g
    p = p - LR * (m / (np.sqrt(v) + EPSILON) + DECAY * p)
  return p


def _update_op(variables, how):
  """The op assigning p, m and v their updated values, made `how`."""
  if how == "function":
    @tf.function(jit_compile=True)
    def update():
      new = _update(*[variables[n].read_value() for n in "pmvg"])
      for name, value in zip("pmv", new):
        variables[name].assign(value)
      return tf.constant(True)
    return update().op
  scope = (tf.xla.experimental.jit_scope(separate_compiled_gradients=False)
           if how == "scope" else contextlib.nullcontext())
  with scope:
    inputs = [variables[n].read_value() for n in "pmvg"]
    new = (xla.compile(_update, inputs) if how == "compile"
           else _update(*inputs))
    return tf.group(*[variables[n].assign(value, read_value=False)
                      for n, value in zip("pmv", new)])


def _run(start, how, repeats, steps):
  """(median seconds of an update, its peak bytes above those in use
  before it, p after `steps` updates)."""
  with tf.Graph().as_default():
    variables = {n: tf.compat.v1.get_variable(n, initializer=start[n])
                 for n in "pmvg"}
    update = _update_op(variables, how)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        session.run(update)
      after = session.run(variables["p"])
      times = []
      for _ in range(repeats):
        started = time.perf_counter()
        session.run(update)
        times.append(time.perf_counter() - started)
      tf.config.experimental.reset_memory_stats("CPU:0")
      before = tf.config.experimental.get_memory_info("CPU:0")["current"]
      session.run(update)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
  return float(np.median(times)), peak, after


def main():
  parser = bench.parser(__doc__, repeats=10)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=2,
                      help="the ways interleaved, this many times")
  args = parser.parse_args()
  rng = np.random.RandomState(0)
  start = {n: rng.normal(size=SIZE).astype(np.float32) for n in "pmvg"}
  start["v"] = np.abs(start["v"])
  reference = _reference(start, args.steps)
  rows = bench.Rows(
      f"AdamWeightDecay's update of {SIZE / 1e6:.1f}M float32 parameters; "
      f"distance from float64 after {args.steps} updates; peak: BFC "
      f"allocator", args.json,
      markdown=True, formats={"ms": ".1f", "peak MB": ".0f", "max abs": ".2e",
                              "mean abs": ".2e"})
  ways = (("TensorFlow ops", "ops"), ("XLA: xla.compile", "compile"),
          ("XLA: jit scope (XlaCompile + XlaRun), as fused_apply",
           "scope"),
          ("XLA: jit_compile function (XlaLaunch, in place)", "function"))
  for _ in range(args.rounds):
    for name, how in ways:
      seconds, peak, after = _run(start, how, args.repeats, args.steps)
      distance = np.abs(after - reference)
      rows.add(update=name, ms=seconds * 1e3, **{
          "peak MB": peak / 2**20, "max abs": float(distance.max()),
          "mean abs": float(distance.mean())})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
