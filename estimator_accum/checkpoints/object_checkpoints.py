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

from estimator_accum import keras_private, releases, tf_private
from estimator_accum.checkpoints.state_variables import variable_base_name
from estimator_accum.distribution import replicas

__all__ = ["SyncOnReadCheckpoint", "WINDOW_SLOT_PREFIX", "WrapperCheckpoints"]


WINDOW_SLOT_PREFIX = "window_"


class _Tracking:
  """What a wrapper tracks of the windows it built in one graph."""

  def __init__(self, graph):
    self.graph = graph
    self.windows = {}   # window name -> its index among the wrapper's
    self.slots = {}     # (trained variable's name, slot name) -> state
    self.children = {}  # window state tracked by key ("window/...") -> it
    self.by_name = {}   # state variable name -> state (by-name keys)
    self.variables = {}  # state variable name -> the variable itself


def _unclaimed_state(unclaimed, children=None, slots=None):
  have = sorted(n for n in (children or {}) if "/" in n)
  have += sorted({slot for _, slot in (slots or {})})
  return ValueError(
      f"the checkpoint being restored holds window state {unclaimed} that "
      f"this model's window ({have}) does not have: it was saved by a "
      "window with other settings (reduction, sparse accumulation, "
      "loss scaling), or, from a checkpoint that keys window state by "
      "variable names, for variables named otherwise. "
      "Resuming without it would train wrongly; build the window as it was "
      "saved.")


def _state_views(tracking, state, slot_names, window_name, prefix, children):
  """What a checkpoint saves of each of the window's `state` variables (a
  variable synchronized on read, saved across replicas, through a view),
  recorded in `tracking`: the views that are a trained variable's slots,
  returned by (variable, slot name); the others added to `children` under
  their names (the window's counters under `prefix`). Local variables (a
  parameter-server worker's) are left out."""
  local = tf.compat.v1.local_variables()
  slots = {}
  for name, variable in state.items():
    if any(variable is v for v in local):
      continue
    releases.keras_track_variable(variable)
    if name != "micro_batches":  # (the caller's counter, not the window's)
      tracking.variables[name] = variable
    # (Eagerly, in TensorFlow 2, the variable saves itself across replicas
    # and workers.)
    view = (SyncOnReadCheckpoint(variable)
            if replicas.is_sync_on_read(variable) and
            not tf.executing_eagerly() else variable)
    tracking.by_name[name] = view
    if name in slot_names:
      slots[slot_names[name]] = view
    elif name.startswith(window_name + "/"):
      children[prefix + name[len(window_name):]] = view
    else:
      children[name] = view
  return slots


class WrapperCheckpoints:
  """What one wrapper keeps for object-based checkpoints: what it tracks of
  the window it built in the current graph, and the window slots a
  checkpoint restored before the window was built. Owned by the wrapper's
  `WrapperWindow`."""

  def __init__(self):
    self._current = None
    # (trained variable's name, slot name) -> checkpoint positions.
    self._deferred_slots = {}

  def _tracking(self, graph=None):
    """The wrapper's `_Tracking` of `graph` (the default graph), made anew
    for a new graph, or None if it built no window there and graph is None.
    Eagerly (TensorFlow 2, where the window is built in tf.functions and
    its state is saved and restored outside them), the last one made."""
    current = tf.compat.v1.get_default_graph()
    tracking = self._current
    if tracking is not None and (
        tracking.graph is current or
        (graph is None and tf.executing_eagerly() and
         tracking.graph.building_function)):
      return tracking
    if graph is None:
      return None
    self._current = tracking = _Tracking(current)
    return tracking


  def track(self, owner, optimizer, state, slot_names, window_name):
    """Makes `owner` track what an object-based checkpoint of it must hold.

    That is the inner optimizer's own variables (hyperparameters, step count,
    non-slot variables) by the names the optimizer gives them; the state of
    each trained variable (its accumulators) as that variable's slots
    (`window_accum`, ...), so that it is keyed by the variable's path in the
    model, as the optimizer's own slots are, whatever the variable is named;
    and the window's counters as `window/<counter>` (`window_1/...` for a
    second window the wrapper builds in one graph). State local to a
    parameter-server worker is left out (name-based checkpoints leave it out
    too). What `owner` tracked in an earlier graph is replaced. Values a
    checkpoint loaded before this build holds for the window are restored
    now. Keras is told of the variables as well: a session Keras prepares
    initializes only the variables it knows (model_to_estimator writes its
    first checkpoint from one).

    Args:
      owner: the wrapper, a `tf.compat.v1.train.Optimizer` or a Keras legacy
        optimizer, which serves the inner optimizer's slots itself.
      optimizer: the inner optimizer.
      state: {name: variable} of the window's state variables, in the order
        they were made.
      slot_names: {name: (trained variable's name, slot name)} for the
        state variables that are one trained variable's.
      window_name: the window's name, which its counters' names begin with.

    Raises:
      ValueError: if a checkpoint loaded before this build holds window
        state that this window does not have.
    """
    tracking = self._tracking(tf.compat.v1.get_default_graph())
    index = tracking.windows.setdefault(window_name, len(tracking.windows))
    prefix = "window" if index == 0 else f"window_{index}"
    children = dict(_optimizer_children(optimizer))
    slots = _state_views(tracking, state, slot_names, window_name, prefix,
                         children)
    tracking.slots.update(slots)
    tracking.children.update(children)
    for name, child in sorted(children.items()):
      if isinstance(child, tf.Variable):
        releases.keras_track_variable(child)
      # Values a checkpoint loaded before this build holds for it (Keras's
      # load_weights before fit): restored now.
      tf_private.track_child(owner, name, child)
    self._restore_loaded(owner, tracking, state, slots)
    unclaimed = sorted(n for n in tf_private.deferred_dependency_names(owner)
                       if "/" in n)
    if unclaimed:
      raise _unclaimed_state(unclaimed, children, slots)


  def _restore_loaded(self, owner, tracking, state, slots):
    """Restores what a checkpoint loaded before this build holds for the
    window: as the trained variables' slots, or keyed by the state
    variables' names (by-name keys)."""
    deferred = self._deferred_slots
    for key, view in slots.items():
      for position in deferred.pop(key, ()):
        position.restore(view)
    for name in state:
      if name in tracking.by_name:
        tf_private.restore_deferred(owner, name, tracking.by_name[name])

  def slot_names(self):
    """The slot names of the window state the wrapper built in this graph."""
    tracking = self._tracking()
    return sorted({slot for _, slot in tracking.slots}) if tracking else []


  def variables(self):
    """The window state variables the wrapper built in this graph (those local
    to a parameter-server worker left out), in the order they were made."""
    tracking = self._tracking()
    return list(tracking.variables.values()) if tracking else []


  def slot(self, variable, slot_name):
    """The state the wrapper keeps as `variable`'s slot `slot_name`, or None."""
    tracking = self._tracking()
    if tracking is None or not isinstance(variable, tf.Variable):
      return None
    return tracking.slots.get((variable_base_name(variable), slot_name))


  def restore_slot(self, position, slot_name, variable):
    """Restores a checkpoint's window slot of `variable` into the window's
    state, or keeps it until the window is built.

    Raises:
      ValueError: the checkpoint is a Keras BackupAndRestore backup written
        in the middle of an epoch, which Keras resumes by replaying the
        epoch's first batches.
    """
    _refuse_a_replaying_backup(position)
    state = self.slot(variable, slot_name)
    if state is not None:
      position.restore(state)
    else:
      key = (variable_base_name(variable), slot_name)
      self._deferred_slots.setdefault(key, []).append(position)


  def lookup(self, name):
    """The window state a checkpoint names `name` by-name (keyed by the
    state variable's name, not as a slot); None if the wrapper built no window in this graph, for a name with
    no "/" (not window state), or for window state the wrapper tracks as `name`.

    Raises:
      ValueError: if the wrapper built its window in this graph and has no
        window state `name` (a name with a "/"), which would otherwise be
        dropped silently.
    """
    tracking = self._tracking()
    if tracking is None or "/" not in name or name in tracking.children:
      return None  # (tracked state is found as the dependency it is)
    found = tracking.by_name.get(name)
    if found is None:
      raise _unclaimed_state([name], tracking.children, tracking.slots)
    return found


# What Keras's BackupAndRestore keeps beside the model: the batch of the
# epoch its backup was written after, -1 for a backup at an epoch's end.
_BACKUP_BATCH = "ckpt_saved_batch"


def _refuse_a_replaying_backup(position):
  """Refuses window state from a BackupAndRestore backup written in the
  middle of an epoch (`save_freq` in steps). Keras resumes such a backup by
  running the epoch's input from its start under the later step numbers:
  the window would add the batches it already holds a second time. (Read
  from the restore's object graph, a TensorFlow-private structure.) A
  backup at an epoch's end records the epoch's last batch when another
  callback has batch hooks; Keras resumes it at the next epoch, as the
  callback's own `save_freq='epoch'` says."""
  if keras_private.keras_backup_resumes_at_an_epoch(position):
    return
  graph, path = tf_private.restored_checkpoint(position)
  for child in graph.nodes[0].children:
    if child.local_name != _BACKUP_BATCH:
      continue
    attributes = graph.nodes[child.node_id].attributes
    if not attributes:
      return
    batch = tf.train.load_checkpoint(path).get_tensor(
        attributes[0].checkpoint_key)
    if batch >= 0:
      raise ValueError(
          f"this checkpoint is a BackupAndRestore backup written after batch "
          f"{int(batch)} of an epoch (save_freq in steps): Keras resumes it by "
          "running the epoch's first batches again, which the window would "
          "add a second time. Back up at epochs' ends (save_freq='epoch', "
          "the default), or save with ModelCheckpoint(save_weights_only=True) "
          "and resume with an input that starts where it was written.")


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
    components, complete = replicas.replica_components(self._variable)
    if not complete:
      # The other workers' components are out of reach here.
      raise ValueError(
          f"window variable {self._variable.name} has replicas on other "
          "workers, which an object-based checkpoint built in model_fn "
          "cannot reach: with MultiWorkerMirroredStrategy pass "
          "checkpoint_format='saver' to model_to_estimator.")
    components = [c.read_value() for c in components]
    value = tf.add_n(components)
    if self._variable.aggregation == tf.VariableAggregation.MEAN:
      value = value / len(components)
    return {"VARIABLE_VALUE": value}

  def _restore_from_tensors(self, restored_tensors):
    value = restored_tensors["VARIABLE_VALUE"]
    components, _ = replicas.replica_components(self._variable)
    if self._variable.aggregation == tf.VariableAggregation.SUM:
      value = tf.cast(value / len(components), self._variable.dtype)
    return tf.group([c.assign(value, read_value=False) for c in components])


def _optimizer_children(optimizer):
  """[(name, trackable)]: the checkpointed children of `optimizer` and of the
  optimizers it wraps, without those optimizers (whose slots the wrapper
  serves: tracked too, each slot would be found twice)."""
  if not isinstance(optimizer, tf.__internal__.tracking.Trackable):
    return []
  if "get_slot_names" not in dir(optimizer):
    # A Keras optimizer of the new kind (TensorFlow 2) tracks its slots
    # itself: tracked whole (a Keras LossScaleOptimizer around it
    # unwrapped, as the window unwraps it).
    return [("inner_optimizer",
             getattr(optimizer, "inner_optimizer", optimizer))]
  children = []
  for name, child in tf_private.trackable_children(optimizer).items():
    if "get_slot_names" in dir(child):
      children += _optimizer_children(child)
    else:
      children.append((name, child))
  return children
