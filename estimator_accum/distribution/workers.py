"""Worker identity under a strategy spanning several workers: the training
tasks a save waits for, and the loss each worker reports on its own."""

import tensorflow as tf

from estimator_accum import graph_state, tf_private
from estimator_accum.distribution.replicas import (
  is_multi_worker_collective,
  replica_id,
)


def training_tasks():
  """(the training tasks, e.g. ["chief_0", "worker_0"], this task's name),
  or None if the current strategy is not a collective one over several
  workers."""
  strategy = tf.distribute.get_strategy()
  if not is_multi_worker_collective(strategy):
    return None
  resolver = strategy.cluster_resolver
  if resolver is None:
    return None
  spec = resolver.cluster_spec().as_dict()
  tasks = [f"{job}_{index}" for job in ("chief", "worker")
           for index in range(len(spec.get(job, [])))]
  if len(tasks) < 2:
    return None
  return tasks, f"{resolver.task_type}_{resolver.task_id}"


def report_on_this_worker(value):
  """Makes `value`, one replica's reported loss under a strategy spanning
  several workers, reach Estimator as one value mirrored over this
  worker's replicas, which it reports without an all-reduce.

  Estimator reduces the regrouped per-replica losses with
  `strategy.reduce(MEAN, ...)` (MEAN because the window takes the mean over
  the replicas: `replicas.mark_loss_mean_over_replicas`), and
  MultiWorkerMirroredStrategy returns a `Mirrored` value as it is from a
  MEAN. Regrouping takes a value's container from its
  `_distributed_container`: here a `Mirrored` holding the mean of this
  worker's replicas' values, made once they all exist. Anywhere the
  container is not complete, or where Estimator would SUM, the value is its
  own container, and is reduced as usual.
  """
  if replica_id() is None or not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  devices = tuple(strategy.extended.worker_devices)
  if strategy.num_replicas_in_sync <= len(devices):
    return
  # Owned here: reportable_loss's per-replica calls and their groups.
  registry = graph_state.owned("worker_losses", dict)
  replica = replica_id()
  # The n-th call on each replica is the same loss: group them by n.
  calls = registry.setdefault("calls", {})
  call = calls.get(replica, 0)
  calls[replica] = call + 1
  groups = registry.setdefault("groups", [])
  while len(groups) <= call:
    groups.append({"values": {}, "container": None})
  group = groups[call]
  group["values"][replica] = value
  graph = value.graph

  def container():
    if group["container"] is None:
      if (len(group["values"]) != len(devices) or not           tf_private.loss_marked_mean_over_replicas(graph)):
        return value
      local = [group["values"][r] for r in sorted(group["values"])]
      with graph.as_default(), tf.name_scope("worker_loss"):
        mean = local[0] if len(local) == 1 else tf.add_n(local) / len(local)
        copies = []
        for device in devices:
          with tf.device(device):
            copies.append(tf.identity(mean))
      group["container"] = tf_private.mirrored(copies)
    return group["container"]

  tf_private.report_as_mirrored(value, container)
