"""What the scripts show on the console: their own lines and TensorFlow's
errors and warnings, not its deprecation chatter nor Estimator's INFO lines
(`--verbose` shows everything)."""

import glob
import logging
import os
import re
import signal
import sys
import tempfile
import warnings

# Lines TensorFlow logs for every tf.compat.v1 API the scripts use on
# purpose (graph mode, Estimator): warnings about the API, not the run.
_CHATTER = ("is deprecated and will be removed",
            "Instructions for updating", "use `update_config_proto` instead",
            "Use the iterator's `initializer` property instead",
            "is not passed in. No distribution strategy will be used for "
            "evaluation",
            # Estimator's step counter reads global_step beside the step,
            # in either order, and takes two equal reads for a stall: the
            # scripts' train ops count every micro-batch.
            "It seems that global step (tf.train.get_global_step) has not "
            "been increased")


# What TensorFlow 2.16+ writes from C++ while it loads, through absl before
# absl is set up (TF_CPP_MIN_LOG_LEVEL does not reach it): absl's notice of
# that, and INFO lines about the build (oneDNN, a CPU build's CUDA stub, the
# CPU's instructions, the next line included).
_LOAD_CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"are written to STDERR|I\d{4} .*|To enable the following instructions:"
    r".*)$")
# A build with CUDA on a machine with no NVIDIA device: not an error there.
_NO_GPU_CHATTER = re.compile(r"^E\d{4} .*(cuInit|cuda_platform|cuda_driver).*$")


def import_tensorflow(argv=None):
  """Imports TensorFlow (returned) with the lines it writes while it loads
  and finds its devices held back, then writes those of them that say
  something: a script's first lines are its own, not TensorFlow 2.16+'s
  notes on its build (`_LOAD_CHATTER`) nor a CUDA build's failed cuInit on
  a machine without an NVIDIA device. With `--verbose` in `argv` (default
  sys.argv) every line is written. Call before the script's own work
  (TensorFlow already loaded, as in a forked process: its devices'
  lines are held back)."""
  argv = sys.argv if argv is None else argv
  if any(arg in ("--verbose", "--verbose=true", "--verbose=True",
                 "--verbose=1") for arg in argv):
    import tensorflow as tf  # noqa: PLC0415

    return tf
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      import tensorflow as tf  # noqa: PLC0415

      tf.config.list_physical_devices()
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      _write_said(held.read().decode("utf-8", "replace").splitlines())
  return tf


def _write_said(lines):
  """Writes to stderr those of `lines` (TensorFlow's while it loaded) that
  say something."""
  no_gpu = not glob.glob("/dev/nvidia[0-9]*")
  for line in lines:
    if not (_LOAD_CHATTER.match(line) or
            (no_gpu and _NO_GPU_CHATTER.match(line))):
      sys.stderr.write(line + "\n")
  sys.stderr.flush()


class _NoChatter(logging.Filter):
  def filter(self, record):
    message = record.getMessage()
    return not any(text in message for text in _CHATTER)


def quiet_tensorflow(verbose=False):
  """Keeps TensorFlow's and Estimator's own lines to warnings and errors,
  without deprecation notices, unless `verbose`. Call before the scripts'
  TensorFlow work (the C++ level must be set before TensorFlow loads)."""
  if verbose:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # noqa: PLC0415 (after the C++ level is set)

  logger = tf.get_logger()
  logger.setLevel(logging.WARNING)
  if not any(isinstance(f, _NoChatter) for f in logger.filters):
    logger.addFilter(_NoChatter())
  for module in ("tensorflow", "keras", "tf_slim", "tensorflow_estimator"):
    warnings.filterwarnings("ignore", module=module)


def quiet_xla_start(verbose=False):
  """Makes XLA's CPU client with the process's stderr closed, unless
  `verbose`: TensorFlow 2.15's first XLA compile on CPU logs "Compiled
  cluster using XLA!" through absl (whatever TF_CPP_MIN_LOG_LEVEL says,
  after absl's own "WARNING: All log messages before absl::InitializeLog()
  ..."), and the first stream XLA's CPU client makes "SetPriority
  unimplemented for this stream" at ERROR. Each once a process: compiling
  and running one tiny function here makes the compile count and the
  stream, which the job's compiled window end then reuses. Call it where
  nothing else writes to stderr (before the job's threads start); a
  SIGTERM or SIGINT that comes meanwhile is handled once stderr is back."""
  if verbose:
    return
  import tensorflow as tf  # noqa: PLC0415 (after quiet_tensorflow)

  sys.stderr.flush()
  # A SIGTERM or SIGINT meanwhile waits for stderr: what its handler says
  # must be seen.
  stops = {signal.SIGTERM, signal.SIGINT}
  masked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
  saved = os.dup(2)
  null = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(null, 2)
    with tf.device("/CPU:0"):
      tf.function(jit_compile=True)(lambda x: x + 1.0)(tf.constant(0.0))
  except Exception:  # noqa: BLE001
    # Said where it matters: the job's own compiled step fails the same
    # way, with stderr open.
    pass
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(null)
    signal.pthread_sigmask(signal.SIG_SETMASK, masked)
