"""Files written whole or not at all, and the library's cache directory."""

import contextlib
import os
import uuid

import tensorflow as tf


@contextlib.contextmanager
def whole(path):
  """A temporary path beside `path` for the block to write, renamed over
  `path` when the block ends, removed when it fails: a reader sees the old
  file or the whole new one, never part of it (a full disk or a kill
  mid-write leaves the old one). Unique to the process and the call, so
  that writers of one file at once (a job's workers) never share one."""
  temporary = f"{path}.{os.getpid()}-{uuid.uuid4().hex}.tmp"
  try:
    yield temporary
    tf.io.gfile.rename(temporary, path, overwrite=True)
  except BaseException:
    try:
      tf.io.gfile.remove(temporary)
    except (tf.errors.OpError, OSError):
      pass
    raise


def write_whole(path, text):
  """Writes `text` to `path` through a temporary file renamed over it
  (`whole`)."""
  with whole(path) as temporary:
    with tf.io.gfile.GFile(temporary, "w") as writer:
      writer.write(text)


def cache_dir():
  """$ESTIMATOR_ACCUM_CACHE, else $XDG_CACHE_HOME/estimator_accum, else
  ~/.cache/estimator_accum."""
  if os.environ.get("ESTIMATOR_ACCUM_CACHE"):
    return os.environ["ESTIMATOR_ACCUM_CACHE"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "estimator_accum")
