"""Going on with a smaller micro-batch after running out of memory.

A run that ran out of memory at micro-batch m x k goes on from its last
checkpoint with m/2 x 2k: the same effective batch, the same examples in
the same windows. `global_step` counts micro-batches, so the checkpoint's
count is doubled (each micro-batch trained is two of the new plan's), which
keeps the windows aligned, the update count (global_step // k) and the
position in a seeded input. This is exact only at a window boundary, where
no window is partly accumulated; `halve_checkpoint` refuses any other.
"""

import gc
import os
import re

import numpy as np
import tensorflow as tf

# Checkpointed counters of micro-batches (global_step and the replicas' own
# positions in the window): scaled with the micro-batch.
_MICRO_BATCH_COUNTERS = re.compile(r"(^|/)(global_step|local_micro_batches)$")
# A partly accumulated window holds a nonzero count here.
_WINDOW_COUNTS = re.compile(r"/(window_micro_batches|window_examples)$")


def is_out_of_memory(error):
  """True for the error an allocator raises when it runs out of memory."""
  return isinstance(error, tf.errors.ResourceExhaustedError) and (
      "OOM" in str(error) or "out of memory" in str(error).lower())


def halve_checkpoint(model_dir, plan):
  """Rewrites the latest checkpoint in `model_dir` for `plan.halved()`.

  Returns (the halved plan, the checkpoint step before, after). Raises
  ValueError (one line) when the plan cannot be halved exactly, there is
  no checkpoint, or it is not at a window boundary.
  """
  smaller = plan.halved()
  latest = tf.train.latest_checkpoint(model_dir)
  if latest is None:
    # None saved yet (a new run saves nothing at global step 0,
    # LeanCheckpointSaverHook): start again with the smaller plan.
    return smaller, 0, 0
  values = _read(latest)
  step = int(values["global_step"])
  partial = {name: float(value) for name, value in values.items()
             if _WINDOW_COUNTS.search(name) and np.any(value)}
  if step % plan.k or partial:
    raise ValueError(
        f"{latest}: saved mid-window (micro-batch {step}, k={plan.k}); only "
        "a checkpoint at a window boundary can go on with another "
        "micro-batch exactly (save every multiple of k micro-batches)")
  for name, value in values.items():
    if _MICRO_BATCH_COUNTERS.search(name):
      values[name] = value * 2
  older = tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths
  written = _write(values, os.path.join(model_dir, "model.ckpt"), step * 2)
  for prefix in older:  # Counted in the old plan's micro-batches.
    if os.path.basename(prefix) != os.path.basename(written):
      for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.remove(path)
  return smaller, step, step * 2


def _read(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def _write(values, prefix, step):
  """Saves `values` as a name-based checkpoint `prefix`-`step`, the
  directory's latest; returns its path.

  One SaveV2 of the fed values, with no variables: it runs right after
  training ran out of memory, so it holds the values once, not twice (a
  Saver of variables initialized from them held both and waited on the
  allocator for memory that the limit did not have)."""
  path = f"{prefix}-{step}"
  names = sorted(values)
  graph = tf.Graph()
  with graph.as_default():
    feeds = {}
    for name in names:
      value = np.asarray(values[name])
      dtype = tf.string if value.dtype == object else tf.as_dtype(value.dtype)
      feeds[tf.compat.v1.placeholder(dtype, value.shape)] = value
    save = tf.raw_ops.SaveV2(prefix=path, tensor_names=names,
                             shape_and_slices=[""] * len(names),
                             tensors=list(feeds))
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(save, feed_dict=feeds)
  tf.compat.v1.train.update_checkpoint_state(
      os.path.dirname(path), path, all_model_checkpoint_paths=[path])
  return path


class OutOfMemory(RuntimeError):
  """Training ran out of memory and the plan could not be halved."""


def train_halving_on_oom(train, plan, model_dir, log=print):
  """Runs `train(plan)`; on running out of memory, halves the micro-batch,
  doubles k and runs `train` again from the last checkpoint, until it
  fits or the micro-batch cannot be halved exactly (OutOfMemory, one
  line). Each change is one line to `log`. Returns the plan that ran."""
  while True:
    try:
      train(plan)
      return plan
    except tf.errors.ResourceExhaustedError as error:
      if not is_out_of_memory(error):
        raise
    # Outside the except block: its traceback holds the failed run's frames,
    # its session among them, and whatever memory they keep is memory the
    # halved checkpoint's write needs (with too little, that write waits on
    # the BFC allocator's retries).
    gc.collect()
    try:
      smaller, before, after = halve_checkpoint(model_dir, plan)
    except ValueError as reason:
      raise OutOfMemory(f"out of memory at micro-batch {plan.micro_batch} "
                        f"x k={plan.k}, and {reason}") from None
    log(f"out of memory at micro-batch {plan.micro_batch} x k={plan.k}: "
        f"going on with micro-batch {smaller.micro_batch} x k={smaller.k} "
        f"from the checkpoint at micro-batch {before} (micro-batch {after} "
        f"of the new plan); the effective batch stays "
        f"{plan.effective_batch}")
    plan = smaller
