"""Google's AdamWeightDecay update of one large variable, as TensorFlow's
elementwise ops (about ten passes over memory) and compiled by XLA into one
fused loop (`xla.compile`, graph mode), side by side: the time of one
update, and each one's distance from the same update in float64 after
`--steps` updates (the fused loop rounds differently, not worse).

The variable is MiniLM's word-embedding table's size (30522 x 384); the
window's end applies this update to every trained variable.

  python benchmarks/xla_update.py [--repeats 10] [--steps 10]
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
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


def _run(start, compiled, repeats, steps):
  """(median seconds of an update, p after `steps` updates)."""
  with tf.Graph().as_default():
    variables = {n: tf.compat.v1.get_variable(n, initializer=start[n])
                 for n in "pmvg"}
    inputs = [variables[n].read_value() for n in "pmvg"]
    new = xla.compile(_update, inputs) if compiled else _update(*inputs)
    update = tf.group(*[variables[n].assign(value, read_value=False)
                        for n, value in zip("pmv", new)])
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
  return float(np.median(times)), after


def main():
  parser = bench.parser(__doc__, repeats=10)
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args()
  rng = np.random.RandomState(0)
  start = {n: rng.normal(size=SIZE).astype(np.float32) for n in "pmvg"}
  start["v"] = np.abs(start["v"])
  reference = _reference(start, args.steps)
  rows = bench.Rows(
      f"AdamWeightDecay's update of {SIZE / 1e6:.1f}M float32 parameters; "
      f"distance from float64 after {args.steps} updates", args.json,
      markdown=True, formats={"ms": ".1f", "max abs": ".2e",
                              "mean abs": ".2e"})
  for name, compiled in (("TensorFlow ops", False), ("XLA, one loop", True)):
    seconds, after = _run(start, compiled, args.repeats, args.steps)
    distance = np.abs(after - reference)
    rows.add(update=name, ms=seconds * 1e3,
             **{"max abs": float(distance.max()),
                "mean abs": float(distance.mean())})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
