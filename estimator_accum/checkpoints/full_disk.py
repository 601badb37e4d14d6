"""A full disk, told as a full disk.

TensorFlow reports a checkpoint save that runs out of space (ENOSPC, or a
quota: EDQUOT) as `ResourceExhaustedError`, the error of an allocation
that does not fit, whose first line is "Graph execution error:". Here such
an error is recognised by what the file system said, the saves it cut short
(their `*_temp` folders, `*.tempstate*` files) are removed, and the line
names the directory, the bytes a checkpoint takes and the bytes free.

    try:
      estimator.train(...)
    except (tf.errors.OpError, OSError) as error:
      if not full_disk.is_full_disk(error):
        raise
      sys.exit(full_disk.describe(model_dir, error))
"""

import errno
import os
import shutil

import tensorflow as tf

__all__ = ["checkpoint_bytes", "describe", "describe_export",
           "is_full_disk", "remove_cut_exports", "remove_cut_saves",
           "short_of_room"]

_SAID = ("No space left on device", "Disk quota exceeded")


def is_full_disk(error):
  """Whether `error` (a tf.errors.OpError or an OSError) is a write that
  found its disk full or its quota used up."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC,
                                                    errno.EDQUOT):
    return True
  text = getattr(error, "message", None) or str(error)
  return any(said in text for said in _SAID)


def _free_bytes(directory):
  while directory and not os.path.isdir(directory):
    directory = os.path.dirname(directory)
  try:
    return shutil.disk_usage(directory or ".").free
  except OSError:
    return None


def _megabytes(count):
  return f"{count / 2**20:.1f} MB"


def checkpoint_bytes(prefix):
  """The bytes the checkpoint `prefix` takes (its index and data files)."""
  return sum(tf.io.gfile.stat(path).length
             for path in tf.io.gfile.glob(f"{prefix}.index") +
             tf.io.gfile.glob(f"{prefix}.data-*"))


def remove_cut_saves(directory):
  """Removes what saves cut short left in `directory` (a sharded save's
  `<prefix>_temp` folder, a file's `.tempstate` copy); returns their
  names."""
  removed = []
  for path in tf.io.gfile.glob(os.path.join(directory, "*_temp")):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
      removed.append(os.path.basename(path))
  for path in tf.io.gfile.glob(os.path.join(directory, "*.tempstate*")):
    tf.io.gfile.remove(path)
    removed.append(os.path.basename(path))
  return removed


def remove_cut_exports(export_dir_base):
  """Removes the SavedModels that exports cut short left under
  `export_dir_base` (Estimator's `temp-<version>` folders, the session
  runner's `<version>.temp`); returns their names."""
  removed = []
  for pattern in ("temp-*", "*.temp"):
    for path in tf.io.gfile.glob(os.path.join(export_dir_base, pattern)):
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
        removed.append(os.path.basename(path))
  return removed


def describe_export(export_dir_base, error, checkpoint,
                    flag="--export_dir"):
  """One line for an export under `export_dir_base` that found the disk
  full: the directory, what the file system said, the bytes the exported
  variables take (`checkpoint`'s) and the bytes free. Removes the exports
  it cut short first."""
  remove_cut_exports(export_dir_base)
  return (f"{flag}={export_dir_base}: the disk is full ({_said(error)}): the "
          f"SavedModel's variables take {_megabytes(checkpoint_bytes(checkpoint))}"
          f" ({os.path.basename(checkpoint)}), {_free(export_dir_base)}; "
          f"nothing was exported: free space and run again to export it.")


def _said(error):
  """What the file system said of the full disk, in the error's words."""
  return next((s for s in _SAID if s in str(error)), None) or os.strerror(
      getattr(error, "errno", None) or errno.ENOSPC)


def _free(directory):
  """'N MB free' on `directory`'s disk, or 'free space unknown'."""
  free = _free_bytes(directory)
  return f"{_megabytes(free)} free" if free is not None else "free space unknown"


def describe(directory, error, flag="--output_dir", estimate_bytes=None):
  """One line for a write into `directory` that found the disk full: the
  directory, what the file system said, the bytes a checkpoint takes (its
  newest complete one's; with none yet, `estimate_bytes` as "about", when
  given) and the bytes free, and what to do. Removes the saves it cut short
  first."""
  remove_cut_saves(directory)
  try:
    newest = tf.train.latest_checkpoint(directory)
  except (tf.errors.OpError, ValueError):  # a state file the disk cut short
    newest = None
  if newest:
    needs = (f"a checkpoint takes {_megabytes(checkpoint_bytes(newest))} "
             f"({os.path.basename(newest)}), ")
  elif estimate_bytes:
    needs = f"a checkpoint takes about {_megabytes(estimate_bytes)}, "
  else:
    needs = ""
  resume = (f"; free space and run again to resume from {newest}" if newest
            else "; free space and run again")
  return (f"{flag}={directory}: the disk is full ({_said(error)}): {needs}"
          f"{_free(directory)}{resume}.")


def short_of_room(directory, each_bytes, count, flag="--output_dir"):
  """A line saying `directory` cannot hold `count` checkpoints of about
  `each_bytes`, or None when it can (or its free space or `each_bytes` is
  unknown)."""
  if not each_bytes:
    return None
  free = _free_bytes(directory)
  if free is None or free >= each_bytes * count:
    return None
  return (f"{flag}={directory} has {_megabytes(free)} free, and "
          f"{count} checkpoint(s) of about {_megabytes(each_bytes)} need "
          f"{_megabytes(each_bytes * count)}: the run will stop when the "
          f"disk is full.")
