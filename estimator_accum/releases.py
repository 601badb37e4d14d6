"""What differs between the TensorFlow releases the library runs on.

The library runs on every TensorFlow from 2.15 to 2.21. Four things
differ between them, and this module is the one place that asks:

- `tf.estimator` exists up to 2.15 only; `tf.compat.v1` graphs,
  `MonitoredTrainingSession` and the `tf.compat.v1.train` optimizers go on
  in every release.
- `tf.keras` is Keras 2 on 2.15, and on 2.16+ Keras 3, unless tf-keras is
  installed and `TF_USE_LEGACY_KERAS=1` is set (then Keras 2 again, from
  the `tf_keras` package).
- TensorFlow 2.16+ no longer installs TensorBoard, which provides
  `tf.summary.scalar`.
- XLA's persistent compilation cache (TF_XLA_FLAGS) fails every XLA
  compile on a CPU in 2.15 only.
"""

import importlib.util
import os
import warnings

try:
  import tensorflow as tf
except ModuleNotFoundError:
  raise ImportError(
      "estimator_accum needs TensorFlow 2.15-2.21, and none is installed: "
      "pip install tensorflow (or tensorflow-cpu, or 'tensorflow[and-cuda]' "
      "for a GPU), or 'estimator-accum[cpu]'.") from None

# The releases the library is tested on, first and last.
OLDEST = (2, 15)
NEWEST = (2, 21)

# Without TensorBoard, TensorFlow 2.16+'s `tf.summary.scalar` is a stub
# that raises.
_HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def tensorflow_version():
  """(major, minor) of the TensorFlow imported."""
  major, minor = tf.__version__.split(".")[:2]
  return int(major), int(minor)


def check_tensorflow_version():
  """Refuses a TensorFlow older than 2.15 in one line (ImportError); warns
  once of one newer than the newest tested."""
  version = tensorflow_version()
  if version < OLDEST:
    raise ImportError(
        f"estimator_accum needs TensorFlow 2.15-2.21, and TensorFlow "
        f"{tf.__version__} is installed: upgrade it (pip install "
        f"'tensorflow>=2.15,<2.22', or your build's name: tensorflow-cpu, "
        f"'tensorflow[and-cuda]').")
  if version > NEWEST:
    warnings.warn(
        f"estimator_accum is tested on TensorFlow 2.15-2.21; TensorFlow "
        f"{tf.__version__} is newer, and untested.", stacklevel=3)


def estimator():
  """The `tf.estimator` module where this TensorFlow has it, else None."""
  try:
    return tf.estimator
  except (AttributeError, ImportError):
    return None


def keras_major():
  """3 when `tf.keras` is Keras 3, else 2 (Keras 2.15, or tf-keras)."""
  version = getattr(tf.keras, "__version__", None) or "2"
  return int(str(version).split(".")[0])


def keras_legacy_optimizer_types():
  """(`tf.keras.optimizers.legacy.Optimizer`,) where `tf.keras` is Keras 2;
  () under Keras 3, which has none (its `legacy` names only raise)."""
  if keras_major() >= 3:
    return ()
  return (tf.keras.optimizers.legacy.Optimizer,)


def keras2_module_prefix():
  """The package Keras 2's own modules live in: "keras" on TensorFlow 2.15,
  "tf_keras" where tf-keras serves `tf.keras`; None under Keras 3."""
  if keras_major() >= 3:
    return None
  return tf.keras.optimizers.legacy.Optimizer.__module__.split(".")[0]


def keras_track_variable(variable):
  """Has Keras 2's graph-mode session initialize `variable` (Keras 2's
  `backend.track_variable`, public through `tf.keras.__internal__`); Keras
  3 has no graph-mode session, and nothing to tell."""
  if keras_major() < 3:
    tf.compat.v2.keras.__internal__.backend.track_variable(variable)


def _xla_flags():
  """(TF_XLA_FLAGS, {flag name: its value, "" for a bare flag})."""
  value = os.environ.get("TF_XLA_FLAGS", "")
  flags = {}
  for token in value.split():
    name, _, given = token.lstrip("-").partition("=")
    flags[name] = given
  return value, flags


def xla_cache_fails_on_cpu():
  """TF_XLA_FLAGS where it turns on XLA's persistent compilation cache for
  the CPU (`--tf_xla_persistent_cache_directory`, writable, the device
  types empty or naming CPU) and this TensorFlow then fails every XLA
  compile on a CPU: 2.15 ("TargetRegistry::lookupTarget failed: No
  available targets are compatible with triple "unknown"", at the first
  run of a compiled op; 2.16, 2.18, 2.20 and 2.21 write the cache and run,
  measured). Else None."""
  if tensorflow_version() != (2, 15):
    return None
  value, flags = _xla_flags()
  read_only = flags.get("tf_xla_persistent_cache_read_only")
  types = flags.get("tf_xla_persistent_cache_device_types", "")
  if (not flags.get("tf_xla_persistent_cache_directory") or
      (read_only is not None and read_only.lower() in ("", "true", "1")) or
      (types and "CPU" not in types.upper().split(","))):
    return None
  return value


# `--tf_xla_ops_to_cluster`'s shortcuts for the op kinds XLA fuses
# (FUSIBLE is all of the others). Clustering these alone, the window of a
# table's gradient trains on 2.15 and 2.21, to the weights without XLA
# (2e-8 apart; every sparse_accumulation, fused_apply), each measured.
XLA_FUSIBLE_SHORTCUTS = frozenset(
    ("PW", "RED", "MISC", "PWRED", "REDUCEWINDOW", "REDUCEWINDOWPW", "BN",
     "FUSIBLE"))


def xla_auto_clustering_on_cpu():
  """TF_XLA_FLAGS where it clusters a graph's ops for XLA on the CPU
  (`--tf_xla_auto_jit` above 0 with `--tf_xla_cpu_global_jit`), else
  None. Every release: the window's table accumulators then abort the
  process inside XLA (2.15: std::out_of_range; 2.21: "Check failed:
  buffer != nullptr" in XlaRunOp), measured. None too where
  `--tf_xla_ops_to_cluster` keeps clustering to XLA's fusible kinds
  (`XLA_FUSIBLE_SHORTCUTS`, e.g. FUSIBLE), which train; a list naming ops
  counts as clustering (not measured for every op)."""
  value, flags = _xla_flags()
  auto = flags.get("tf_xla_auto_jit")
  cpu = flags.get("tf_xla_cpu_global_jit")
  if (auto in (None, "", "0", "-1") or cpu is None or
      cpu.lower() in ("false", "0")):
    return None
  kinds = flags.get("tf_xla_ops_to_cluster", "")
  if kinds and set(kinds.split(",")) <= XLA_FUSIBLE_SHORTCUTS:
    return None
  return value


def summary_scalar(tag, value):
  """`tf.summary.scalar(tag, value)`, where a default summary writer
  records; where TensorBoard is not installed (TensorFlow 2.16+ no longer
  brings it) the same summary, written as TensorBoard's scalar plugin
  writes it."""
  if _HAS_TENSORBOARD:
    return tf.summary.scalar(tag, value)
  metadata = tf.compat.v1.SummaryMetadata()
  metadata.plugin_data.plugin_name = "scalars"
  return tf.summary.write(tag=tag, tensor=tf.cast(value, tf.float32),
                          metadata=metadata)


check_tensorflow_version()
