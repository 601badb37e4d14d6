"""The accumulating wrappers in object-based checkpoints.

A Keras model saves its optimizer through the object graph
(`tf.keras.estimator.model_to_estimator`'s default checkpoint format,
`model.save_weights`): what the optimizer tracks is what is saved. A wrapper
takes the plain optimizer's place there: it serves the inner optimizer's
slots (`get_slot`), and `track_window` makes it track the inner optimizer's
own variables under their names, so the keys are the plain optimizer's, and
the window's state variables, so a job stopped mid-window resumes exactly,
as it does from Estimator's name-based checkpoints.

TensorFlow's object-graph hooks (`_track_trackable`, `_trackable_children`,
`_serialize_to_tensors`) are not public API; TensorFlow is pinned to 2.15.
"""

import tensorflow as tf

__all__ = ["SyncOnReadCheckpoint", "track_window"]


def track_window(owner, optimizer, state):
  """Makes `owner` track what an object-based checkpoint of it must hold.

  That is the inner optimizer's own variables (hyperparameters, step count,
  non-slot variables), by the names the optimizer gives them, and the
  window's state variables, but not those local to a parameter-server
  worker (name-based checkpoints leave them out too). What `owner` tracked
  in an earlier graph is replaced. Keras is told of the variables as well:
  a session Keras prepares initializes only the variables it knows
  (model_to_estimator writes its first checkpoint from one).

  Args:
    owner: the wrapper, a `tf.compat.v1.train.Optimizer` or a Keras legacy
      optimizer, which serves the inner optimizer's slots itself.
    optimizer: the inner optimizer.
    state: {name: tf.Variable}, the window's state variables by the names
      they are tracked under.
  """
  tracked = dict(_optimizer_children(optimizer))
  local = tf.compat.v1.local_variables()
  tracked.update((name, variable) for name, variable in state.items()
                 if not any(variable is v for v in local))
  for name, child in sorted(tracked.items()):
    if isinstance(child, tf.Variable):
      tf.compat.v2.keras.__internal__.backend.track_variable(child)
    if _is_sync_on_read(child):
      child = SyncOnReadCheckpoint(child)
    owner._track_trackable(child, name=name, overwrite=True)
    # Values a checkpoint loaded before this build holds for it (Keras's
    # load_weights before fit): restored now.
    owner._handle_deferred_dependencies(name=name, trackable=child)
  # Window state is keyed by variable name (its names hold a "/"; the
  # inner optimizer's do not): state left unclaimed belongs to variables
  # named otherwise, and resuming without it would train wrongly.
  unclaimed = sorted(n for n in owner._deferred_dependencies if "/" in n)
  if unclaimed:
    raise ValueError(
        f"the checkpoint being restored holds window state {unclaimed} "
        f"that this model's window, {sorted(tracked)}, does not have: "
        "window state is keyed by variable name, and these variables are "
        "named otherwise (a second model built in one process gets new "
        "layer names). Build the model with the layer names it was saved "
        "with, e.g. in a new process.")


def _is_sync_on_read(variable):
  return (isinstance(variable, tf.distribute.DistributedValues) and
          variable.synchronization == tf.VariableSynchronization.ON_READ)


class SyncOnReadCheckpoint(tf.__internal__.tracking.Trackable):
  """A per-replica window variable in an object-based checkpoint, saved
  and restored from its replicas' components as Estimator's name-based
  checkpoints save it (the sum, or the mean, over the replicas; a restore
  gives each replica its share), under the key the variable itself would
  have. TensorFlow's own saveable of a sync-on-read variable reads it
  across replicas, which fails where a Keras estimator builds its saver:
  in `model_fn`, in replica context."""

  def __init__(self, variable):
    self._variable = variable

  def _serialize_to_tensors(self):
    replicas = self._variable._distribute_strategy.num_replicas_in_sync
    if replicas > len(self._variable.values):
      # The other workers' components are out of reach here.
      raise ValueError(
          f"window variable {self._variable.name} has replicas on other "
          "workers, which an object-based checkpoint built in model_fn "
          "cannot reach: with MultiWorkerMirroredStrategy pass "
          "checkpoint_format='saver' to model_to_estimator.")
    components = [c.read_value() for c in self._variable.values]
    value = tf.add_n(components)
    if self._variable.aggregation == tf.VariableAggregation.MEAN:
      value = value / len(components)
    return {"VARIABLE_VALUE": value}

  def _restore_from_tensors(self, restored_tensors):
    value = restored_tensors["VARIABLE_VALUE"]
    components = self._variable.values
    if self._variable.aggregation == tf.VariableAggregation.SUM:
      value = tf.cast(value / len(components), self._variable.dtype)
    return tf.group([c.assign(value, read_value=False) for c in components])


def _optimizer_children(optimizer):
  """[(name, trackable)]: the checkpointed children of `optimizer` and of the
  optimizers it wraps, without those optimizers (whose slots the wrapper
  serves: tracked too, each slot would be found twice)."""
  if not isinstance(optimizer, tf.__internal__.tracking.Trackable):
    return []
  children = []
  for name, child in optimizer._trackable_children().items():
    if "get_slot_names" in dir(child):
      children += _optimizer_children(child)
    else:
      children.append((name, child))
  return children
