"""The library's door to TensorFlow's private runtime, one function each:
this process's devices and CPU kernels, the coordination service,
MonitoredSession's remaking of a session, tf.data's per-device datasets.

As `tf_private.py` (the door to graphs, distribution, optimizers and
checkpoints): written for TensorFlow 2.15 and checked on every release to
2.21; each function names the private attribute, call or module it uses
and why no public API serves; `tests/unit/test_tf_private.py` runs each
against the installed TensorFlow. No other module of the library reads or
writes a private name of TensorFlow's (`tests/test_design.py` checks it).
"""

import sys
import weakref

import tensorflow as tf

# Devices ------------------------------------------------------------------


def local_devices():
  """This process's devices with their memory limits
  (`tensorflow.python.client.device_lib.list_local_devices`):
  `tf.config` gives no device's memory."""
  from tensorflow.python.client import device_lib  # noqa: PLC0415

  return device_lib.list_local_devices()


def onednn_enabled():
  """Whether this process runs TensorFlow's oneDNN CPU kernels
  (`tensorflow.python.util._pywrap_util_port.IsMklEnabled`): TensorFlow
  2.15 turns them on by default only on CPUs with AVX-512-class features,
  else as TF_ENABLE_ONEDNN_OPTS says; no public API tells which path runs,
  and memory and speed differ between them."""
  from tensorflow.python.util import _pywrap_util_port  # noqa: PLC0415

  return bool(_pywrap_util_port.IsMklEnabled())


# Coordination service -----------------------------------------------------


def coordination_service_configured():
  """Whether this process's eager context has a coordination service
  configured (`tensorflow.python.eager.context`, not exported)."""
  from tensorflow.python.eager import context  # noqa: PLC0415

  return context.context().coordination_service is not None


def wait_for_coordination_service_value(key):
  """The value of `key` in this job's coordination service, once a task
  has set it: blocks until then (without the GIL), or raises when the
  service ends (`tensorflow.python.eager.context`'s get_config_key_value,
  not exported; how TensorFlow's own PreemptionWatcher waits for a
  preemption notice)."""
  from tensorflow.python.eager import context  # noqa: PLC0415

  return context.context().get_config_key_value(key)


def configure_coordination_service(leader, heartbeat_timeout_ms, jobs):
  """Configures this process's coordination service, as a multi-worker
  strategy does, with `heartbeat_timeout_ms`: TensorFlow 2.15 has no
  public call for the heartbeat
  (`tensorflow.python.eager.context.configure_coordination_service`).

  Args:
    leader: the service leader's task, "/job:<name>/replica:0/task:<i>".
    heartbeat_timeout_ms: int.
    jobs: [(job name, number of tasks)] the service coordinates.
  """
  from tensorflow.python.eager import context  # noqa: PLC0415

  try:  # TensorFlow 2.15
    from tensorflow.tsl.protobuf import (  # noqa: PLC0415
      coordination_config_pb2,
    )
  except ImportError:  # 2.16+: TSL moved under XLA
    from tensorflow.compiler.xla.tsl.protobuf import (  # noqa: PLC0415
      coordination_config_pb2,
    )

  context.context().configure_coordination_service(
      service_type="standalone", service_leader=leader,
      heartbeat_timeout_in_ms=int(heartbeat_timeout_ms),
      coordinated_jobs=[
          coordination_config_pb2.CoordinatedJob(name=name, num_tasks=count)
          for name, count in jobs])


def recoverable_session_class():
  """`tf.compat.v1.train.MonitoredSession`'s inner `_RecoverableSession`
  (tensorflow/python/training/monitored_session.py, 2.15 to 2.21): it
  closes a session whose step raised AbortedError or UnavailableError and
  makes a new one, with no public hook that sees it happen."""
  from tensorflow.python.training import monitored_session  # noqa: PLC0415

  return monitored_session._RecoverableSession  # noqa: SLF001


def on_session_remade(callback):
  """Calls `callback(error)` where a MonitoredSession is about to make its
  session anew after `error` (AbortedError or UnavailableError) closed the
  old one: `_RecoverableSession.close` (called while that error is being
  handled) and `_RecoverableSession._create_session` (which makes the new
  one), both wrapped. A MultiWorkerMirroredStrategy job must not remake
  its session on one worker alone (`distribution/recreated_session.py`).
  No public API tells that a session is being remade."""
  recoverable = recoverable_session_class()
  errors = (tf.errors.AbortedError, tf.errors.UnavailableError)
  lost = weakref.WeakKeyDictionary()
  original_close = recoverable.close
  original_create = recoverable._create_session  # noqa: SLF001

  def close(self):
    error = sys.exc_info()[1]
    if isinstance(error, errors):
      lost[self] = error
    return original_close(self)

  def create_session(self):
    error = lost.pop(self, None)
    if error is not None:
      callback(error)
    return original_create(self)

  recoverable.close = close
  recoverable._create_session = create_session  # noqa: SLF001


def per_device_datasets_without_autotune():
  """Turns tf.data's autotuning off on the per-device datasets a
  MultiDeviceIterator builds
  (`multi_device_iterator_ops._create_device_dataset`, 2.15 to 2.21; what
  a distribution strategy's input runs through). Those are a generator and a fixed prefetch:
  nothing to tune, but each iterator's autotuning thread sleeps up to 60 s
  between optimizations and is joined when the session closes, which held
  a MultiWorkerMirroredStrategy job's end up to a minute. A user's
  `input_fn` cannot reach these datasets' options. Idempotent."""
  from tensorflow.python.data.ops import (  # noqa: PLC0415
    multi_device_iterator_ops,
  )

  original = multi_device_iterator_ops._create_device_dataset  # noqa: SLF001
  if getattr(original, "_estimator_accum", False):
    return
  options = tf.data.Options()
  options.autotune.enabled = False

  def create_device_dataset(*args, **kwargs):
    return original(*args, **kwargs).with_options(options)

  create_device_dataset._estimator_accum = True  # noqa: SLF001
  multi_device_iterator_ops._create_device_dataset = create_device_dataset  # noqa: SLF001
