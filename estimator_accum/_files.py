"""Files written whole or not at all."""

import os

import tensorflow as tf


def write_whole(path, text):
  """Writes `text` to `path` through a temporary file renamed over it: a
  reader sees the old file or the new one, never part of it (a full disk
  or a kill mid-write leaves the old one; the temporary is removed when
  the write fails)."""
  temporary = f"{path}.{os.getpid()}.tmp"
  try:
    with tf.io.gfile.GFile(temporary, "w") as writer:
      writer.write(text)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  except BaseException:
    try:
      tf.io.gfile.remove(temporary)
    except (tf.errors.OpError, OSError):
      pass
    raise
