"""The window end's compiled AdamWeightDecay over MiniLM's weights, as one XLA function or as several run side by side.

`fused_apply` compiles the optimizer's whole apply into one
`tf.function(jit_compile=True)` (one XlaLaunch, which updates the
variables in place). TensorFlow's executor runs independent XlaLaunch
ops at once, each on a thread of its own; whether one function's loops
use both cores is what the ways below show.
This times google-research/bert's AdamWeightDecay update (the gradient
read from the accumulator, which is then zeroed) of all-MiniLM-L6-v2's
variables (the 30522 x 384 word-embedding table and the 6 layers', ~22.7M
floats) made four ways, interleaved in one process:

- one function over every variable (what the window's end runs today);
- two functions, the variables dealt alternately (the table in one);
- one function per variable;
- one function per variable with the table held as 4 row-slices of its
  own (what a partitioned table would give).

Each way's update is the same arithmetic on the same values
(`xla_update.py`'s AdamWeightDecay step), on the BFC allocator as the
main job runs; only how it is cut into compiled functions differs.

  python benchmarks/end_split.py [--repeats 12] [--rounds 2]
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.xla_update import _update  # noqa: E402
from harness import bench  # noqa: E402

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 384, 1536, 6, 30522


def _shapes(table_slices):
  """MiniLM-L6's trained variables' shapes, the table in `table_slices`."""
  rows = -(-VOCAB // table_slices)
  shapes = [[min(rows, VOCAB - i * rows), HIDDEN]
            for i in range(table_slices)]
  shapes += [[512, HIDDEN], [2, HIDDEN], [HIDDEN], [HIDDEN]]
  for _ in range(LAYERS):
    shapes += [[HIDDEN, HIDDEN], [HIDDEN]] * 4
    shapes += [[HIDDEN, INTERMEDIATE], [INTERMEDIATE],
               [INTERMEDIATE, HIDDEN], [HIDDEN]]
    shapes += [[HIDDEN]] * 4
  return shapes + [[HIDDEN, HIDDEN], [HIDDEN], [HIDDEN, 2], [2]]


def _compiled(group):
  """The update of `group` ((p, m, v, accumulator) tuples) as one XLA
  function's call; returns its output tensor."""
  def update():
    for p, m, v, accumulator in group:
      g = accumulator.read_value()
      for variable, value in zip((p, m, v), _update(p, m, v, g)):
        variable.assign(value)
      accumulator.assign(tf.zeros_like(g))
    return tf.constant(True)
  return tf.function(update, jit_compile=True, autograph=False)()


def _time(way, repeats):
  """(median, min) seconds of one end made `way`."""
  slices = 4 if way == "per variable, the table in 4 slices" else 1
  with tf.Graph().as_default():
    rng = np.random.RandomState(0)
    variables = []
    for i, shape in enumerate(_shapes(slices)):
      values = {n: rng.uniform(0.1, 1.0, shape).astype(np.float32)
                for n in "pmva"}
      variables.append(tuple(
          tf.compat.v1.get_variable(f"{n}{i}", initializer=values[n])
          for n in "pmva"))
    if way == "one function":
      groups = [variables]
    elif way == "two functions":
      groups = [variables[0::2], variables[1::2]]
    else:
      groups = [[v] for v in variables]
    end = tf.group([_compiled(group) for group in groups])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(end)  # the compile
      session.run(end)
      times = []
      for _ in range(repeats):
        started = time.perf_counter()
        session.run(end)
        times.append(time.perf_counter() - started)
  return float(np.median(times)), min(times)


def main():
  parser = bench.parser(__doc__, repeats=12)
  parser.add_argument("--rounds", type=int, default=2,
                      help="the ways interleaved, this many times")
  args = parser.parse_args()
  count = sum(int(np.prod(s)) for s in _shapes(1))
  rows = bench.Rows(
      f"AdamWeightDecay's compiled update of MiniLM-L6's {count / 1e6:.1f}M "
      f"float32 weights, {os.cpu_count()} cores", args.json, markdown=True,
      formats={"median ms": ".1f", "min ms": ".1f", "vs one function": ".2f"})
  ways = ("one function", "two functions", "per variable",
          "per variable, the table in 4 slices")
  for round_ in range(args.rounds):
    base = None
    for way in ways:
      median, least = _time(way, args.repeats)
      base = base or median
      rows.add(round=round_ + 1, way=way, **{
          "median ms": median * 1e3, "min ms": least * 1e3,
          "vs one function": base / median})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
