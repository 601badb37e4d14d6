"""Which checkpoints of a directory are complete, and resuming from the
newest that is.

A checkpoint cut short by a full disk or a killed copy, a missing data
shard, a flipped bit in its index or data, or an empty `checkpoint` state
file made Estimator (and `tf.train.latest_checkpoint`) fail deep inside
TensorFlow, or resume from nothing. Here a checkpoint is complete when its
index reads and every tensor it lists reads whole with its checksum, and
`resume_from_complete` points the directory's state at the newest complete
one, naming each one it skips in a line; the files themselves are left
where they are (a later save of the same step replaces them).

    newest = integrity.resume_from_complete(model_dir, report=print)
    estimator.train(...)        # restores `newest`, or starts anew (None)
"""

import os
import re

import tensorflow as tf
from google.protobuf import text_format

from estimator_accum import _files

__all__ = ["NoCompleteCheckpoint", "newest_complete", "problem",
           "resume_from_complete"]

_STEP = re.compile(r"-(\d+)$")
_READ_ERRORS = (tf.errors.OpError, IndexError, ValueError, OSError)


class NoCompleteCheckpoint(RuntimeError):
  """The directory holds checkpoints, and none of them is complete."""


def _first_line(error):
  """The error's first line; its start and end when long (TensorFlow's
  say what failed last)."""
  lines = str(error).strip().splitlines()
  text = lines[0] if lines else type(error).__name__
  return text if len(text) <= 200 else f"{text[:80]} ... {text[-110:]}"


def _data_files(prefix):
  return sorted(tf.io.gfile.glob(f"{prefix}.data-*"))


def problem(prefix):
  """What is wrong with the checkpoint `prefix`, in a phrase that names the
  file; None when it is complete (its index and every tensor it lists read
  whole, their checksums right).

  Args:
    prefix: str, a checkpoint's path without `.index` ("dir/model.ckpt-30").
  """
  index = f"{prefix}.index"
  if not tf.io.gfile.exists(index):
    return f"{index} is missing"
  try:
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
  except _READ_ERRORS as error:
    return f"{index} cannot be read ({_first_line(error)})"
  data = _data_files(prefix)
  for name in names:
    try:
      reader.get_tensor(name)
    except _READ_ERRORS as error:
      message = _first_line(error)
      if "No such file" in message or not data:
        return f"a data shard of {prefix} is missing ({message})"
      if "less bytes" in message:
        sizes = ", ".join(
            f"{os.path.basename(path)} {tf.io.gfile.stat(path).length} bytes"
            for path in data)
        return (f"its data is cut short ({sizes}): tensor {name!r} cannot "
                f"be read whole")
      return f"tensor {name!r} cannot be read ({message})"
  return None


def _step(prefix):
  found = _STEP.search(prefix)
  return int(found.group(1)) if found else -1


def _state(directory):
  """The directory's CheckpointState, or None when it has none or it
  cannot be read (an empty or garbled `checkpoint` file)."""
  try:
    return tf.train.get_checkpoint_state(directory)
  except _READ_ERRORS:
    return None


def _candidates(directory):
  """Checkpoint prefixes in `directory`, newest (highest step) first: those
  the state names and those whose index lies there. A state's path is taken
  as the file of that name in `directory`: a Saver given an absolute path
  writes absolute paths, which in a copied or moved directory name the
  original's files."""
  found = set()
  state = _state(directory)
  if state is not None:
    found.update(os.path.join(directory, os.path.basename(path)) for path in (
        *state.all_model_checkpoint_paths, state.model_checkpoint_path)
        if path)
  found.update(path[:-len(".index")]
               for path in tf.io.gfile.glob(os.path.join(directory, "*.index")))
  return sorted(found, key=lambda path: (_step(path), path), reverse=True)


def newest_complete(directory, report=None):
  """The newest complete checkpoint of `directory`, or None when it holds
  none at all.

  Args:
    directory: str, a model directory.
    report: callable taking one line, told of each checkpoint skipped.

  Raises:
    NoCompleteCheckpoint: the directory holds checkpoints and none is
      complete; its message names each and what is wrong.
  """
  skipped = []
  for prefix in _candidates(directory):
    wrong = problem(prefix)
    if wrong is None:
      return prefix
    skipped.append(f"{prefix}: {wrong}")
    if report is not None:
      report(f"skipping checkpoint {prefix}: {wrong}")
  if skipped:
    raise NoCompleteCheckpoint(
        f"no checkpoint in {directory} is complete ({'; '.join(skipped)}); "
        f"restore a copy, or remove them to start anew.")
  return None


def _write_state(directory, newest, paths):
  """Writes the `checkpoint` state file as a Saver does (paths relative to
  `directory`), whole or not at all: a temporary file renamed over it."""
  state = tf.compat.v1.train.generate_checkpoint_state_proto(
      directory, newest, all_model_checkpoint_paths=paths)
  _files.write_whole(os.path.join(directory, "checkpoint"),
                     text_format.MessageToString(state))


def resume_from_complete(directory, report=None):
  """Points `directory`'s checkpoint state at its newest complete checkpoint
  (what Estimator, `MonitoredTrainingSession` and a Saver restore), after
  checking it; returns it, or None when the directory holds no checkpoint.

  The state is rewritten only when it named another checkpoint or could not
  be read; it then lists the older checkpoints it listed, and the newest
  complete last. Every task of a job may call it: they write the same state.

  Args:
    directory: str, a model directory (it may not exist yet).
    report: callable taking one line, told of each checkpoint skipped.

  Raises:
    NoCompleteCheckpoint: as `newest_complete`.
  """
  if not tf.io.gfile.isdir(directory):
    return None
  newest = newest_complete(directory, report)
  if newest is None:
    return None
  state = _state(directory)
  named = state.model_checkpoint_path if state is not None else None
  if named == newest:
    return newest
  older = [os.path.join(directory, os.path.basename(path))
           for path in (state.all_model_checkpoint_paths if state else ())
           if _step(path) < _step(newest)]
  _write_state(directory, newest, older + [newest])
  return newest
