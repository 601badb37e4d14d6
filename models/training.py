"""The training half of the examples' model_fns, with or without
accumulation."""

import atexit
import contextlib
import hashlib
import json
import os
import re
import stat
import sys
import tempfile

import numpy as np
import tensorflow as tf

import estimator_accum
from clusterspec import config as tfc
from estimator_accum import releases
from estimator_accum.checkpoints import full_disk, integrity, run_lock


def end_finished_run():
  """Ends a script whose run finished: the exit handlers run (the
  library's, absl's, TensorFlow's), the summary writers and the streams
  are flushed, then the process exits with 0 without Python's teardown of
  TensorFlow's graphs, sessions and modules, which took 1.2 s of the main
  job's run (2026-12-07) and keeps nothing."""
  tf.compat.v1.summary.FileWriterCache.clear()
  atexit._run_exitfuncs()  # noqa: SLF001 (CPython's: what exit runs first)
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):
      stream.flush()
  os._exit(0)


def default_model_dir(prefix):
  """Where a run goes without --model_dir: a new temporary directory; in a
  TF_CONFIG cluster of several tasks, one the tasks share, named after the
  cluster (every task computes the same name; a fresh temporary directory
  each made the workers' save barrier wait for each other's markers in
  directories the others never saw). A cluster across machines needs a
  shared --model_dir anyway: the watchdog then says this one is not shared.

  Raises:
    SystemExit: that directory exists and is not this user's own.
  """
  config = tfc.task_of((*tfc.TRAINING_TYPES, tfc.PS, tfc.EVALUATOR))
  cluster = (config or {}).get("cluster") or {}
  if sum(len(tasks) for tasks in cluster.values()) < 2:
    return tempfile.mkdtemp(prefix=prefix + "_")
  digest = hashlib.sha1(json.dumps(cluster, sort_keys=True).encode())
  path = os.path.join(tempfile.gettempdir(),
                      f"{prefix}_{digest.hexdigest()[:12]}")
  os.makedirs(path, mode=0o700, exist_ok=True)
  status = os.lstat(path)
  if stat.S_ISLNK(status.st_mode) or status.st_uid != os.geteuid():
    raise SystemExit(f"{prefix}: error: {path}, this cluster's default "
                     "--model_dir, is not a directory of this user's own; "
                     "give --model_dir")
  if os.listdir(path) and (config.get("task") or {}).get("index", 0) == 0:
    print(f"{prefix}: {path} already holds a run of this same cluster "
          "(its addresses and ports): it resumes from there; give "
          "--model_dir for a new run", file=sys.stderr, flush=True)
  return path


def remove_own_worker_checkpoints(model_dir):
  """A MultiWorkerMirroredStrategy worker other than the chief saves its
  own copy of every checkpoint (the model's size each, and its graph and
  events) in model_dir/tmp_<type>_<i>, as Estimator has it. Once this
  worker's training has ended nothing reads them: a restarted job resumes
  from the chief's. Removes this worker's (run_classifier.py does the
  same)."""
  config = tfc.task_of(tfc.TRAINING_TYPES)
  if config is None:
    return
  task = config.get(tfc.TASK) or {}
  kind, index = task.get(tfc.TYPE), int(task.get(tfc.INDEX, 0))
  leads = kind == tfc.CHIEF or (
      kind == tfc.WORKER and index == 0 and
      tfc.CHIEF not in config.get(tfc.CLUSTER, {}))
  path = os.path.join(model_dir, f"tmp_{kind}_{index}")
  if not leads and tf.io.gfile.isdir(path):
    tf.io.gfile.rmtree(path)


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
  return estimator_accum.EstimatorSpec(
      estimator_accum.ModeKeys.TRAIN, loss=loss, train_op=train_op,
      training_hooks=hooks)


def estimator(model_fn, **kwargs):
  """The examples' Estimator of `model_fn`: tf.estimator's where
  TensorFlow has it (2.15), else `estimator_accum.Estimator` (2.16+), the
  same arguments. The model_fns, their specs (`estimator_accum.EstimatorSpec`,
  `ModeKeys`), RunConfig and train_and_evaluate are written once through
  the library's names, which are tf.estimator's on 2.15."""
  tf_estimator = releases.estimator()
  kind = (estimator_accum.Estimator if tf_estimator is None else
          tf_estimator.Estimator)
  return kind(model_fn, **kwargs)


# Exit code of an example whose training diverged or whose evaluation is
# not finite (bad flags exit 1 or 2, as absl's do).
DIVERGED_EXIT_CODE = 3
# Exit code of an example whose --model_dir holds checkpoints, none of them
# complete (docs/operations.md).
NO_COMPLETE_CHECKPOINT_EXIT_CODE = 4
# Exit code of a run whose disk filled up (docs/operations.md).
DISK_FULL_EXIT_CODE = 5


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


@contextlib.contextmanager
def guarded_run(program, model_dir, flag="--model_dir"):
  """The run of `program` in `model_dir` (made if missing), inside a
  `with`: the directory's lock held (another live run there: one line,
  exit 1; the tasks of one TF_CONFIG cluster share it), its checkpoints
  checked (`resume_from_complete`: exit 4 if none is complete), and a full
  disk, from the lock's first write on, named in one line that says what
  to free (exit 5)."""
  try:
    tf.io.gfile.makedirs(model_dir)
    lock = _hold(program, model_dir, flag)
    try:
      resume_from_complete(program, model_dir, flag)
      yield
    finally:
      lock.release()
  except (tf.errors.OpError, OSError) as error:
    if not full_disk.is_full_disk(error):
      raise
    print(f"{program}: error: {full_disk.describe(model_dir, error, flag)}",
          file=sys.stderr)
    raise SystemExit(DISK_FULL_EXIT_CODE) from None


def _hold(program, model_dir, flag):
  """`model_dir`'s run lock; another live run holding it exits 1 with one
  line."""
  cluster = (tfc.task_of(tfc.TRAINING_TYPES) or {}).get(tfc.CLUSTER)
  try:
    return run_lock.hold(model_dir, cluster=cluster, flag=flag,
                         report=lambda line: print(line, flush=True))
  except run_lock.DirectoryInUse as error:
    print(f"{program}: error: {error}", file=sys.stderr)
    raise SystemExit(1) from None


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
