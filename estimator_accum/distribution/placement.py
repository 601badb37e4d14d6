"""Where a window's state lives in between-graph (parameter-server)
training: on the worker that computes the micro-batch, not on the ps."""

import contextlib

import tensorflow as tf

from estimator_accum.distribution import replicas


def between_graph_worker_device(computed, shared):
  """The worker's device in parameter-server (between-graph) training.

  Estimator places variables on the ps tasks and the rest on the worker
  (replica_device_setter), and so does a
  `tf.compat.v1.distribute.experimental.ParameterServerStrategy` given as
  `train_distribute`: a `shared` variable on a ps job and a `computed`
  tensor on another job mean each worker must keep its own window, on its
  own device. Returns None otherwise (one device, or another strategy).
  """
  if replicas.has_strategy() and not replicas.is_parameter_server():
    return None
  shared = tf.DeviceSpec.from_string(shared.device or "")
  here = tf.DeviceSpec.from_string(computed.device or "")
  if shared.job != "ps" or not here.job or here.job == "ps":
    return None
  return tf.DeviceSpec(job=here.job, replica=here.replica,
                       task=here.task).to_string()


@contextlib.contextmanager
def on_worker(local_device):
  """Places the variables created inside on `local_device`, if not None.

  Without a strategy, `tf.device` does it: it overrides the job of Estimator's
  ps placement function, which merges the op's device into its own. A
  ParameterServerStrategy instead creates every variable under its own ps
  placement, inside any device scope of the caller's; it honours one request
  only, the `colocate_with` a `colocate_vars_with` scope passes to its
  variable creator (which accepts only the strategy's own variables), so it
  is asked the same way to colocate with an op placed on the worker.
  """
  if local_device is None:
    # tf.device(None) would also drop the ps placement function.
    yield
    return
  if not tf.distribute.has_strategy():
    with tf.device(local_device):
      yield
    return
  with tf.device(local_device):
    anchor = tf.no_op(name="worker_state_placement")

  def colocate_with_worker(next_creator, **kwargs):
    kwargs["colocate_with"] = anchor
    return next_creator(**kwargs)

  with tf.compat.v1.variable_creator_scope(colocate_with_worker):
    yield
