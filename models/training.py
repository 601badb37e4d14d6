"""The training half of the examples' model_fns, with or without
accumulation."""

import re
import sys

import numpy as np
import tensorflow as tf

import estimator_accum
from estimator_accum.checkpoints import integrity


def train_spec(loss, optimizer, params, log_every=200):
  """EstimatorSpec for TRAIN: accumulation when params["k"] > 1, else plain
  `optimizer.minimize` (so the examples can compare the two)."""
  k = params.get("k", 1)
  hooks = []
  if k > 1:
    train_op = estimator_accum.build_accumulating_train_op(loss, optimizer, k)
    hooks.append(estimator_accum.AccumulationLoggingHook(
        every_n_micro_batches=log_every,
        micro_batch_size=params.get("micro_batch_size")))
    # A NaN micro-batch costs its window, not the run; under
    # MultiWorkerMirroredStrategy each worker reports its own loss.
    loss = estimator_accum.reportable_loss(loss)
  else:
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(tf.estimator.ModeKeys.TRAIN, loss=loss,
                                    train_op=train_op, training_hooks=hooks)


# Exit code of an example whose training diverged or whose evaluation is
# not finite (bad flags exit 1 or 2, as absl's do).
DIVERGED_EXIT_CODE = 3
# Exit code of an example whose --model_dir holds checkpoints, none of them
# complete (docs/operations.md).
NO_COMPLETE_CHECKPOINT_EXIT_CODE = 4


def resume_from_complete(program, model_dir, flag="--model_dir"):
  """Checks `model_dir`'s checkpoints before an Estimator restores one: a
  checkpoint cut short or corrupted is skipped with one line, the state
  names the newest complete one; none complete exits 4 with one line
  naming the directory as the script's `flag`."""
  try:
    integrity.resume_from_complete(
        model_dir, report=lambda line: print(line, flush=True))
  except integrity.NoCompleteCheckpoint as error:
    print(f"{program}: error: {flag}: {error}", file=sys.stderr)
    raise SystemExit(NO_COMPLETE_CHECKPOINT_EXIT_CODE) from None


def define_checkpoint_flags(flags, every_n_micro_batches):
  """Defines --save_checkpoints_steps and --keep_checkpoint_max on `flags`
  (absl.flags): a crash loses at most `every_n_micro_batches` of work."""
  flags.DEFINE_integer(
      "save_checkpoints_steps", every_n_micro_batches, "Micro-batches "
      "between checkpoints (a crash restarts from the last one).",
      lower_bound=1)
  flags.DEFINE_integer(
      "keep_checkpoint_max", 2, "Checkpoints kept (weights, optimizer "
      "slots and window); older ones are deleted.", lower_bound=1)


def check_finite(program, metrics):
  """Raises SystemExit(DIVERGED_EXIT_CODE) with one line naming the
  evaluation metrics that are not finite."""
  bad = {key: value for key, value in metrics.items()
         if not np.all(np.isfinite(value))}
  if bad:
    print(f"{program}: error: evaluation is not finite: " + ", ".join(
        f"{key} = {value}" for key, value in sorted(bad.items())) +
          "; the model diverged.", file=sys.stderr)
    raise SystemExit(DIVERGED_EXIT_CODE)


def exit_if_diverged(program, function, *args, **kwargs):
  """Runs `function`; a stop for divergence becomes one line on stderr and
  SystemExit(DIVERGED_EXIT_CODE)."""
  try:
    return function(*args, **kwargs)
  except tf.errors.InvalidArgumentError as error:
    if not estimator_accum.is_divergence(error):
      raise
    found = re.search(r"training diverged: .*?\(NaN/Inf\)", str(error))
    print(f"{program}: error: {found.group(0) if found else 'training diverged'}"
          "; lower the learning rate or clip.", file=sys.stderr)
    raise SystemExit(DIVERGED_EXIT_CODE) from None
