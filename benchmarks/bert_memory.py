"""Peak tensor memory and time of one BERT training step, in a process of
its own.

  python benchmarks/bert_memory.py --model large --length 384 \
      --micro_batch 2 --mode recompute

prints one JSON line: the allocator's peak bytes (null: out of memory) and
the mean seconds of a micro-batch (for the window, also the peak of a
micro-batch that adds and of one that ends the window). Random weights,
random token ids, dropout 0.1 kept, Google's classifier head and
AdamWeightDecay (learning rate 1e-5). Modes:

  plain       Google's step: the optimizer on the batch, no accumulation
  accumulate  the window, k=2 (one micro-batch adds, the next applies)
  recompute   the window, each transformer layer recomputed
              (`BertModel(..., recompute=True)`)

Tensor memory is the peak of TensorFlow's BFC allocator on CPU
(TF_CPU_ALLOCATOR_USE_BFC=true, set here), which holds tensors as a GPU's
allocator does; on this machine it stands in for a GPU's memory.
"""

import json
import os
import subprocess
import sys
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import bench  # noqa: E402

MODES = ("plain", "accumulate", "recompute")
CONFIGS = {
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096),
}


def build(model, length, micro_batch, mode):
  """The training step of `mode` in the default graph; returns its op."""
  import tensorflow as tf  # noqa: PLC0415

  import estimator_accum  # noqa: PLC0415
  from models.bert import classifier, modeling, optimization  # noqa: PLC0415

  config = modeling.BertConfig(vocab_size=30522, **CONFIGS[model])
  ids = tf.random.uniform([micro_batch, length], maxval=30522, dtype=tf.int32)
  features = {"input_ids": ids, "input_mask": tf.ones_like(ids),
              "segment_ids": tf.zeros_like(ids)}
  labels = tf.random.uniform([micro_batch], maxval=2, dtype=tf.int32)
  logits, _ = classifier.create_model(config, True, features, 2,
                                      recompute=mode == "recompute")
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))
  optimizer = optimization.make_optimizer("adamw", 1e-5)
  step = tf.compat.v1.train.get_or_create_global_step()
  if mode == "plain":
    variables = tf.compat.v1.trainable_variables()
    return optimizer.apply_gradients(
        zip(tf.gradients(loss, variables), variables), global_step=step)
  return estimator_accum.build_accumulating_train_op(
      loss, optimizer, 2, log_every_n_micro_batches=None, summaries=False)


def measure(model, length, micro_batch, mode, steps=3):
  """In this process: {"peak_bytes", "step_seconds", ...}. Plain: one
  untimed step, then `steps` - 1 timed. The window (k=2): one untimed
  window, then each kind of micro-batch measured alone: one that adds
  ("micro_batch_peak_bytes") and one that ends the window and applies
  ("window_end_peak_bytes"); its time is their mean, the time per
  micro-batch of a window of 2."""
  import tensorflow as tf  # noqa: PLC0415

  def run(session, op, runs=1):
    tf.config.experimental.reset_memory_stats("CPU:0")
    started = time.perf_counter()
    for _ in range(runs):
      session.run(op)
    return (tf.config.experimental.get_memory_info("CPU:0")["peak"],
            (time.perf_counter() - started) / runs)

  with tf.Graph().as_default():
    train_op = build(model, length, micro_batch, mode)
    init = tf.compat.v1.global_variables_initializer()
    parameters = sum(v.shape.num_elements()
                     for v in tf.compat.v1.trainable_variables())
    result = {"model": model, "length": length, "micro_batch": micro_batch,
              "mode": mode, "parameters": parameters, "peak_bytes": None,
              "step_seconds": None}
    try:
      with tf.compat.v1.Session() as session:
        session.run(init)
        if mode == "plain":
          session.run(train_op)
          peak, seconds = run(session, train_op, max(steps - 1, 1))
        else:
          session.run(train_op)
          session.run(train_op)
          adds, add_seconds = run(session, train_op)
          ends, end_seconds = run(session, train_op)
          peak, seconds = max(adds, ends), (add_seconds + end_seconds) / 2
          result.update(micro_batch_peak_bytes=adds,
                        window_end_peak_bytes=ends)
        result.update(peak_bytes=peak, step_seconds=seconds)
    except tf.errors.ResourceExhaustedError:
      pass
  return result


def point(model, length, micro_batch, mode, steps=3):
  """`measure` in a process of its own (a fresh allocator)."""
  result = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--model", model,
       "--length", str(length), "--micro_batch", str(micro_batch),
       "--mode", mode, "--steps", str(steps)],
      capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise RuntimeError(f"{model} {length} x {micro_batch} {mode} failed:\n"
                       f"{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--model", choices=sorted(CONFIGS), default="base")
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--micro_batch", type=int, default=8)
  parser.add_argument("--mode", choices=MODES, default="accumulate")
  parser.add_argument("--steps", type=int, default=3)
  args = parser.parse_args()
  from absl import logging  # noqa: PLC0415
  logging.set_verbosity(logging.ERROR)
  point = measure(args.model, args.length, args.micro_batch, args.mode,
                  args.steps)
  # The one line printed is the JSON a parent reads (`point`); --json
  # appends it as a row, with what it measured.
  bench.Rows("BERT step memory", args.json).add(
      model=args.model, length=args.length, micro_batch=args.micro_batch,
      mode=args.mode, **point)
  print(json.dumps(point))
  return 0


if __name__ == "__main__":
  sys.exit(main())
