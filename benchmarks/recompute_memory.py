"""Recomputation against no recomputation and TensorFlow's tf.recompute_grad:
peak tensor memory, time per step and gradient error.

  python benchmarks/recompute_memory.py [--bert base --length 128 --batch 8]

1. A residual MLP of 12 blocks (width 1024, inner 4096, dropout 0.1),
   micro-batch 512, plain SGD: peak and time per step of the plain graph,
   of `tf.recompute_grad` around each block, and of
   `estimator_accum.recompute` around each block; with dropout off, each
   one's largest gradient error against the plain graph (relative to the
   largest entry); with dropout 0.5 on one dense layer, each one's largest
   gradient error against the true gradient of the forward that ran (the
   mask read off the forward's output). Then the recomputed peak's parts:
   the weights, every block's input, and one block's working set (a
   one-block step's peak less its weights and input); it fails above 1.3x
   of their sum.
2. A BERT layer stack: Google's `transformer_model` in BERT-Base's shape
   (12 layers, 768 wide, dropout 0.1) at `--length` tokens (default 384),
   micro-batch `--batch` (default 8), plain SGD: peak and time per step
   without and with `recompute=True`.
3. The whole BERT training step (`--bert`, classifier head,
   AdamWeightDecay, the window with k=2): the peak of a micro-batch that
   adds, of one that ends the window, and the time per micro-batch,
   without and with `BertModel(..., recompute=True)`.

Every figure comes from a process of its own. Tensor memory is the peak of
TensorFlow's BFC allocator on CPU (TF_CPU_ALLOCATOR_USE_BFC=true), which
holds tensors as a GPU's allocator does. Exits 1 when recomputation's
gradient is off or its peak is not lower.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import bench  # noqa: E402

VARIANTS = ("plain", "tf.recompute_grad", "estimator_accum.recompute")
BLOCKS, WIDTH, INNER, BATCH = 12, 1024, 4096, 512


def _wrap(variant, block):
  import tensorflow as tf  # noqa: PLC0415

  import estimator_accum  # noqa: PLC0415
  if variant == "tf.recompute_grad":
    def reusing(h):
      # tf.recompute_grad runs the block again; its variables must be
      # found, not made again.
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=tf.compat.v1.AUTO_REUSE):
        return block(h)
    return tf.recompute_grad(reusing)
  if variant == "estimator_accum.recompute":
    return estimator_accum.recompute(block)
  return block


def _stack(variant, rate, batch, blocks=BLOCKS, width=WIDTH, inner=INNER):
  import tensorflow as tf  # noqa: PLC0415

  h = tf.random.stateless_normal([batch, width], seed=[1, 2])
  for index in range(blocks):
    def block(x, index=index):
      with tf.compat.v1.variable_scope(f"block_{index}"):
        up = tf.compat.v1.get_variable(
            "up", [width, inner], initializer=tf.compat.v1.initializers
            .random_normal(stddev=width ** -0.5, seed=index))
        down = tf.compat.v1.get_variable(
            "down", [inner, width], initializer=tf.compat.v1.initializers
            .random_normal(stddev=inner ** -0.5, seed=100 + index))
      u = tf.nn.relu(tf.matmul(x, up))
      if rate:
        u = tf.nn.dropout(u, rate=rate)
      return x + tf.matmul(u, down)
    h = _wrap(variant, block)(h)
  return tf.reduce_mean(tf.square(h))


def mlp_memory(variant, steps=4, blocks=BLOCKS):
  """{peak_bytes, step_seconds} of an SGD step of the residual MLP."""
  import tensorflow as tf  # noqa: PLC0415

  with tf.Graph().as_default():
    loss = _stack(variant, 0.1, BATCH, blocks=blocks)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.config.experimental.reset_memory_stats("CPU:0")
      session.run(train_op)
      started = time.perf_counter()
      for _ in range(steps - 1):
        session.run(train_op)
      seconds = (time.perf_counter() - started) / (steps - 1)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return {"peak_bytes": peak, "step_seconds": seconds}


def stack_memory(recompute, length, batch, steps=3):
  """{peak_bytes, step_seconds} of an SGD step of BERT-Base's layers."""
  import tensorflow as tf  # noqa: PLC0415

  from models.bert import modeling  # noqa: PLC0415
  with tf.Graph().as_default():
    inputs = tf.random.stateless_normal([batch, length, 768], seed=[3, 4])
    mask = tf.ones([batch, length, length])
    output = modeling.transformer_model(
        inputs, mask, num_hidden_layers=12, hidden_size=768,
        num_attention_heads=12, intermediate_size=3072, recompute=recompute)
    loss = tf.reduce_mean(tf.square(output))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op)
      tf.config.experimental.reset_memory_stats("CPU:0")
      started = time.perf_counter()
      for _ in range(steps - 1):
        session.run(train_op)
      seconds = (time.perf_counter() - started) / (steps - 1)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return {"peak_bytes": peak, "step_seconds": seconds}


def mlp_gradients(variant):
  """Gradients of every variable, dropout off, small sizes (as lists)."""
  import tensorflow as tf  # noqa: PLC0415

  with tf.Graph().as_default():
    loss = _stack(variant, 0.0, 32, blocks=4, width=64, inner=256)
    variables = tf.compat.v1.trainable_variables()
    gradients = tf.gradients(loss, variables)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return [session.run(g).tolist() for g in gradients]


def dropout_error(variant, runs=5):
  """Largest |gradient - true gradient| over `runs`, and the largest true
  entry: one dense layer, dropout 0.5, loss sum(y * c)."""
  import numpy as np  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415

  rng = np.random.RandomState(0)
  x_value = rng.randn(16, 32).astype(np.float32)
  c = rng.randn(16, 64).astype(np.float32)
  with tf.Graph().as_default():
    x = tf.constant(x_value)

    def layer(h):
      with tf.compat.v1.variable_scope("layer"):
        kernel = tf.compat.v1.get_variable("kernel", [32, 64])
      return tf.nn.dropout(tf.matmul(h, kernel), rate=0.5)

    y = _wrap(variant, layer)(x)
    kernel = tf.compat.v1.trainable_variables()[0]
    (gradient,) = tf.gradients(tf.reduce_sum(y * c), [kernel])
    worst = largest = 0.0
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(runs):
        y_value, gradient_value = session.run([y, gradient])
        true = x_value.T @ ((y_value != 0) * 2.0 * c)
        worst = max(worst, float(np.abs(gradient_value - true).max()))
        largest = max(largest, float(np.abs(true).max()))
  return {"error": worst, "largest": largest}


def _child(task, *args):
  result = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", task, *args],
      capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise RuntimeError(f"{task} {args} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def _run_child(task, args):
  from absl import logging  # noqa: PLC0415
  logging.set_verbosity(logging.ERROR)
  if task == "mlp_memory":
    return mlp_memory(args[0], blocks=int(args[1]) if args[1:] else BLOCKS)
  if task == "mlp_gradients":
    return mlp_gradients(args[0])
  if task == "dropout":
    return dropout_error(args[0])
  if task == "stack":
    return stack_memory(args[0] == "recompute", int(args[1]), int(args[2]))
  from benchmarks import bert_memory  # noqa: PLC0415
  return bert_memory.measure(args[0], int(args[1]), int(args[2]), args[3],
                             steps=4)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--bert", default="base", choices=["base", "large"])
  parser.add_argument("--length", type=int, default=384)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--skip_mlp", action="store_true")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args, rest = parser.parse_known_args()
  if args.child:
    print(json.dumps(_run_child(args.child, rest)))
    return 0
  print("Tensor memory: the peak of TensorFlow's BFC allocator on CPU "
        "(TF_CPU_ALLOCATOR_USE_BFC=true), as a GPU holds tensors.")
  tables = [] if args.skip_mlp else [_mlp_table(args.json)]
  tables.append(_stack_table(args))
  tables.append(_bert_table(args))
  return max(table.exit_code() for table in tables)


def _mlp_table(json_path):
  import numpy as np  # noqa: PLC0415
  gradient, dropout_error = ("gradient error, dropout off",
                             "dropout gradient error (largest true entry)")
  table = bench.Rows(
      f"\nresidual MLP, {BLOCKS} blocks {WIDTH}->{INNER}->{WIDTH}, "
      f"dropout 0.1, micro-batch {BATCH}, SGD", json_path, markdown=True,
      formats={"peak MB": ",.0f", "s/step": ".2f", gradient: ".1e"})
  reference = [np.array(g) for g in _child("mlp_gradients", "plain")]
  rows = {}
  for variant in VARIANTS:
    memory = _child("mlp_memory", variant)
    gradients = [np.array(g) for g in _child("mlp_gradients", variant)]
    error = max(float(np.abs(a - b).max() / np.abs(b).max())
                for a, b in zip(gradients, reference))
    dropout = _child("dropout", variant)
    rows[variant] = (memory, error, dropout)
    table.add(**{"variant": variant,
                 "peak MB": memory["peak_bytes"] / 2**20,
                 "s/step": memory["step_seconds"], gradient: error,
                 dropout_error: f"{dropout['error']:.2g} "
                                f"({dropout['largest']:.2g})"})
  ours, plain = rows["estimator_accum.recompute"], rows["plain"]
  print(f"estimator_accum.recompute: peak "
        f"{ours[0]['peak_bytes'] / plain[0]['peak_bytes']:.2f}x, time "
        f"{ours[0]['step_seconds'] / plain[0]['step_seconds']:.2f}x of plain")
  if ours[1] > 1e-6 or ours[2]["error"] > 1e-4 * ours[2]["largest"]:
    table.fail("the MLP's recomputed gradient is off")
  if ours[0]["peak_bytes"] >= plain[0]["peak_bytes"]:
    table.fail("recomputation did not lower the MLP's peak")
  _mlp_peak_parts(table, ours[0]["peak_bytes"])
  return table


def _mlp_peak_parts(table, recomputed_peak):
  """What the recomputed peak holds, part by part: the state (every
  block's weights), every block's input (kept for the recomputation), and
  one block's working set: the peak of a one-block step less its weights
  and its input. Fails above 1.3x of their sum."""
  weights = BLOCKS * 2 * WIDTH * INNER * 4
  block_input = BATCH * WIDTH * 4
  one_block = _child("mlp_memory", "plain", "1")["peak_bytes"]
  working = one_block - weights // BLOCKS - block_input
  total = weights + BLOCKS * block_input + working
  ratio = recomputed_peak / total
  print(f"its peak's parts: weights {weights / 2**20:,.0f} MB + {BLOCKS} "
        f"block inputs {BLOCKS * block_input / 2**20:,.0f} MB + one block's "
        f"working set {working / 2**20:,.0f} MB (a one-block step's peak "
        f"{one_block / 2**20:,.0f} MB less its weights and input) = "
        f"{total / 2**20:,.0f} MB; the recomputed peak "
        f"{recomputed_peak / 2**20:,.0f} MB is {ratio:.2f}x of it")
  if ratio > 1.3:
    table.fail(f"the recomputed peak is {ratio:.2f}x its parts' sum "
               "(more than 1.3x)")


def _stack_table(args):
  table = bench.Rows(
      f"\nBERT-Base's layer stack (transformer_model, 12 x 768), "
      f"{args.length} tokens, micro-batch {args.batch}, SGD, dropout 0.1",
      args.json, markdown=True,
      formats={"peak MB": ",.0f", "s per step": ".2f"})
  stack = {mode: _child("stack", mode, str(args.length), str(args.batch))
           for mode in ("plain", "recompute")}
  for mode, result in stack.items():
    table.add(mode=mode, **{"peak MB": result["peak_bytes"] / 2**20,
                            "s per step": result["step_seconds"]})
  peak = stack["recompute"]["peak_bytes"] / stack["plain"]["peak_bytes"]
  time_ratio = stack["recompute"]["step_seconds"] / stack["plain"][
      "step_seconds"]
  print(f"recompute: peak {peak:.2f}x ({1 - peak:.0%} lower), time "
        f"{time_ratio:.2f}x")
  if peak >= 1:
    table.fail("recomputation did not lower the layer stack's peak")
  return table


def _bert_table(args):
  adds, ends = ("peak MB, a micro-batch that adds",
                "peak MB, one that ends the window")
  table = bench.Rows(
      f"\nthe BERT-{args.bert.capitalize()} training step at 128 tokens, "
      f"micro-batch {args.batch}, AdamWeightDecay, the window of k=2",
      args.json, markdown=True,
      formats={adds: ",.0f", ends: ",.0f", "s per micro-batch": ".2f"})
  for mode in ("accumulate", "recompute"):
    result = _child("bert", args.bert, "128", str(args.batch), mode)
    table.add(mode=mode, **{
        adds: result["micro_batch_peak_bytes"] / 2**20,
        ends: result["window_end_peak_bytes"] / 2**20,
        "s per micro-batch": result["step_seconds"]})
  return table


if __name__ == "__main__":
  sys.exit(main())
