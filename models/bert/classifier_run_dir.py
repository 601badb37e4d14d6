"""run_classifier.py's --output_dir: named, checked and made before
anything is written, marked with the task and model it holds, locked for
the run, and read for where a run resumes."""

import datetime
import hashlib
import json
import os

import tensorflow as tf

from estimator_accum.checkpoints import full_disk, run_lock
from models.bert.classifier_errors import UsageError

RUN_INFO = "run_info.json"


def default(task, cluster):
  """runs/<task>-<time>, or runs/<task>-cluster-<hash> in a TF_CONFIG
  cluster: every task of the job lands in one directory, named by the
  cluster they share, not by each one's start time."""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  if cluster:
    stamp = "cluster-" + hashlib.sha1(json.dumps(
        cluster, sort_keys=True).encode()).hexdigest()[:10]
  return os.path.join("runs", f"{task}-{stamp}")


def prepare(path, task, bert_config):
  """Checks `path` before anything is written, creates it, and records
  which task and model it holds; refuses one that holds another's.
  Returns whether it was created here."""
  if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
    raise UsageError(f"--output_dir={path} is a file, not a directory.")
  existed = tf.io.gfile.exists(path)
  try:
    tf.io.gfile.makedirs(path)
    probe = os.path.join(path, f".write_test_{os.getpid()}")
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("")
    tf.io.gfile.remove(probe)
  except (OSError, tf.errors.OpError) as error:
    reason = getattr(error, "strerror", None) or getattr(
        error, "message", None) or str(error)
    raise UsageError(f"--output_dir={path} is not writable: "
                     f"{reason.splitlines()[0]}") from None
  info_path = os.path.join(path, RUN_INFO)
  info = {"task_name": task, "bert_config": bert_config.to_dict()}
  if tf.io.gfile.exists(info_path):
    with tf.io.gfile.GFile(info_path) as f:
      text = f.read()
    try:
      held = json.loads(text)
    except ValueError as error:
      raise UsageError(
          f"--output_dir={path} holds a {RUN_INFO} that is not JSON "
          f"({error}): remove it, or give this run another "
          "--output_dir.") from None
    _refuse_another_run(path, held, info)
  else:
    # Written whole, then renamed into place: a cluster's tasks share
    # --output_dir and start together, and one must never read the file
    # half written.
    partial = os.path.join(path, f".{RUN_INFO}.{os.getpid()}")
    try:
      with tf.io.gfile.GFile(partial, "w") as f:
        json.dump(info, f, indent=2)
      tf.io.gfile.rename(partial, info_path, overwrite=True)
    except (OSError, tf.errors.OpError):  # a full disk: nothing half left
      if tf.io.gfile.exists(partial):
        tf.io.gfile.remove(partial)
      raise
  return not existed


def _refuse_another_run(path, held, info):
  """UsageError naming both runs if `held` (the run_info of --output_dir)
  is of another task or model than `info` (this run's)."""
  if held.get("task_name") != info["task_name"]:
    raise UsageError(
        f"--output_dir={path} holds a run of task {held.get('task_name')}, "
        f"not {info['task_name']}: give this run another --output_dir.")
  there, here = held.get("bert_config", {}), info["bert_config"]
  changed = sorted(key for key in set(there) | set(here)
                   if there.get(key) != here.get(key))
  if changed:
    differences = ", ".join(f"{key} {there.get(key)} there, {here.get(key)} "
                            "here" for key in changed[:3])
    raise UsageError(
        f"--output_dir={path} holds a run of another model ({differences}): "
        "give this run another --output_dir.")


def hold(path, cluster):
  """The lock of --output_dir for this run (shared by the tasks of one
  TF_CONFIG cluster); a UsageError naming the live run that holds it."""
  try:
    return run_lock.hold(path, cluster=cluster,
                         report=lambda line: print(line, flush=True))
  except run_lock.DirectoryInUse as error:
    raise UsageError(str(error)) from None


def remove_if_empty(path):
  """Removes `path` and its subdirectories if they hold no file but our
  run_info.json and lock (a start that failed before writing anything)."""
  ours = {RUN_INFO, run_lock.LOCK_NAME}
  for root, _, files in os.walk(path, topdown=False):
    if set(files) <= (ours if root == path else set()):
      for name in files:
        os.remove(os.path.join(root, name))
      if not os.listdir(root):
        os.rmdir(root)


def checkpoint_estimate(init_checkpoint):
  """The bytes of one of the run's checkpoints, about 4x the model (its
  weights, the optimizer's two slots, the window's sums); None without an
  `init_checkpoint` to measure."""
  if not init_checkpoint:
    return None
  try:
    return 4 * full_disk.checkpoint_bytes(init_checkpoint)
  except tf.errors.OpError:
    return None


def warn_if_short_of_room(path, init_checkpoint, keep_checkpoint_max):
  """Says at the start when `path` cannot hold `keep_checkpoint_max`
  checkpoints (`checkpoint_estimate`'s each)."""
  line = full_disk.short_of_room(
      path, checkpoint_estimate(init_checkpoint), keep_checkpoint_max)
  if line:
    print(f"warning: {line}", flush=True)


def resumed_at(path):
  """The micro-batch a run in `path` resumes at: its latest checkpoint's
  global step (0 for a new run), said in one line."""
  latest = tf.train.latest_checkpoint(path)
  if not latest:
    return 0
  step = int(tf.train.load_checkpoint(latest).get_tensor("global_step"))
  print(f"resuming from {latest} at micro-batch {step}", flush=True)
  return step


def require_checkpoint(path, what):
  """UsageError unless `path` holds a checkpoint to `what` with (without
  one Estimator would use an untrained classifier head)."""
  if tf.train.latest_checkpoint(path) is None:
    raise UsageError(
        f"--do_train=false: nothing to {what}, --output_dir={path} holds no "
        "checkpoint; train first (--do_train) or give the --output_dir of a "
        "trained run.")


def size(path):
  """Bytes in the files under `path`; a file removed while they are
  counted counts nothing (another worker removing its own save directory,
  `tmp_worker_<i>`, as its job ends: a CI run's chief failed on it)."""
  total = 0
  for root, _, names in os.walk(path):
    for name in names:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except FileNotFoundError:
        pass
  return total
