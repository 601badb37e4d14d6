"""The window's state variables: how they are made and who records them.

All state variables are non-trainable, saved in checkpoints, and created
with `synchronization=ON_READ, aggregation=SUM` when each replica keeps its
own (the accumulators): under a distribution strategy each replica adds to
its own copy with no communication, and a checkpoint stores the sum over
replicas. `state_variable` makes them with exactly the name asked for;
the `Window` that made them lists them (`Window.state_variables`).
"""

import weakref

import tensorflow as tf

from estimator_accum import graph_state
from estimator_accum.checkpoints import function_variables
from estimator_accum.checkpoints.ordered_saves import order_saves
from estimator_accum.distribution import replicas
from estimator_accum.distribution.placement import on_worker

_SUM = tf.VariableAggregation.SUM


def unfolded_zeros(shape, dtype=tf.float32, partition_info=None):
  """Initializer of zeros that Grappler cannot fold into a constant.

  `zeros_initializer` builds Fill(shape, 0), which Grappler folds into a
  Const node for tensors under its 10 MB limit; the cached initialization
  executor then keeps that constant alive for the whole session: a hidden
  extra copy of every accumulator (measured: 45 MB on BERT-Small). A zero
  scalar from `Empty(init=True)` is not a constant, so neither is the fill.
  """
  del partition_info
  zero = tf.raw_ops.Empty(shape=[], dtype=dtype, init=True)
  return tf.fill(shape, zero)


# {id(trained variable): (a weak reference to it, the name the window keys
# its state by)}, for variables whose own name another trained variable of
# the same build has (name_window_state).
_WINDOW_NAMES = {}


def variable_base_name(var):
  """Returns the strategy-wide name of `var` without the `:0` suffix (or
  the name `name_window_state` gave it, when its own is taken).

  Under a distribution strategy `var.op.name` is the per-replica component
  (`.../replica_1`), which names no variable in replica 0; `var.name` is the
  name every replica shares.
  """
  given = _WINDOW_NAMES.get(id(var))
  if given is not None and given[0]() is var:
    return given[1]
  return var.name.split(":")[0]


def name_window_state(trained):
  """Gives each trained variable of `trained` ([(gradient, variable)]) a
  name no other one has, which the window keys its state by: its own, or,
  for a variable whose name one before it has, that name with `_<n>` (the
  first free n). In a tf.compat.v1 graph names are unique; in TensorFlow 2
  they need not be: Keras 2.15's `load_model` of a SavedModel inside a
  distribution strategy's scope names the variables without their layers
  (two `kernel`s). A SavedModel keeps the window's state by position, so
  these names need only hold within the process. Returns {given name:
  the variable's own}."""
  own = [variable_base_name(v) for _, v in trained]
  taken, given = set(own), {}
  seen = set()
  for (_, variable), name in zip(trained, own):
    if name not in seen:
      seen.add(name)
      continue
    number = 1
    while f"{name}_{number}" in taken:
      number += 1
    alias = f"{name}_{number}"
    taken.add(alias)
    seen.add(alias)
    given[alias] = name
    for each in [variable, *getattr(variable, "values", ())]:
      _forget_when_gone(each)
      _WINDOW_NAMES[id(each)] = (weakref.ref(each), alias)
  return given


def _forget_when_gone(variable):
  key = id(variable)
  weakref.finalize(variable, _WINDOW_NAMES.pop, key, None)


class _Created:
  """What this module keeps per graph: {state variable name: the replica
  id (None in cross-replica context) that created it}, and {name: the
  trained variable whose state it is}."""

  def __init__(self):
    self.creators = {}
    self.owners = {}


class StateVariables:
  """Makes one build's state variables, the way chosen once when the build
  starts, and passed down to every part that keeps state:

  - inside a tf.function (TensorFlow 2, `function_variables`): made once,
    on the first trace, by the wrapper's store;
  - a between-graph (parameter-server) worker's (`local_device` given):
    local variables on the worker's device, initialized by each worker,
    not shared, not checkpointed;
  - else a graph's: resource variables at the root scope, ON_READ for
    per-replica state under a strategy.

  Attributes:
    local_device: the worker's device in between-graph training, or None.
  """

  def __init__(self, local_device=None, store=None):
    """`store`: the tf.function store to make them in (default: the one
    building now, if any)."""
    self.local_device = local_device
    self._store = store or function_variables.building_store()

  def shared(self):
    """The factory for state every worker shares (counters, the loss
    scale): this one's, on no worker's device."""
    return StateVariables(None, self._store)

  def on_worker(self):
    """The scope placing a variable made outside this factory where this
    factory's go."""
    return on_worker(self.local_device)

  def __call__(self, name, shape, dtype, *, per_replica, initial_value=None,
               aggregation=_SUM, slot_of=None, checkpointed=True):
    """Creates a non-trainable state variable with exactly `name`.

    Args:
      name: str, the full variable name (no enclosing variable scope is
        added).
      shape: the variable's shape.
      dtype: the variable's tf.DType.
      per_replica: bool. True for window state that each replica keeps for
        itself (ON_READ, summed when read across replicas); False for state
        shared by every replica (counters).
      initial_value: optional Python number; default zero.
      aggregation: of a per-replica variable: SUM (a checkpoint holds the
        sum over replicas, and a restore gives each replica its share), or
        MEAN (the mean over replicas, restored whole to each: for values
        that are themselves means).
      slot_of: the trained variable whose state this is, if it is one's
        (its name is then `<that variable's name>/<suffix>`), else None.
      checkpointed: bool. False for state that lives for one run only: in
        no collection (neither saved, nor initialized by an initializer,
        nor counted among the window's state); the caller assigns it before
        it reads it.

    Returns:
      The variable, initialized to zeros (or initial_value).

    Raises:
      ValueError: if a variable with that name already exists in the
        graph, which means accumulation was built twice for the same
        variables.
    """
    initializer = (unfolded_zeros if initial_value is None else
                   tf.compat.v1.constant_initializer(initial_value))
    if not per_replica:
      aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
    if self._store is not None:
      synchronization = (tf.VariableSynchronization.ON_READ if per_replica
                         else tf.VariableSynchronization.AUTO)
      return self._store.variable(
          name, tf.TensorShape(shape), dtype, initializer,
          synchronization=synchronization, aggregation=aggregation,
          checkpointed=checkpointed)
    extra = dict(aggregation=aggregation)
    if not checkpointed:
      # In no collection: no saver, no initializer, no readiness check sees
      # it; it is assigned before it is read (see WindowCounters).
      extra["collections"] = []
    elif self.local_device is not None:
      # A ParameterServerStrategy over several devices of a worker sums the
      # replicas' updates of a variable by its aggregation (a ps worker's
      # window is shared by its devices, as central storage's is).
      extra["collections"] = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
    elif per_replica:
      extra.update(replicas.sync_on_read(aggregation))
    return self._in_graph(name, shape, dtype, initializer, extra,
                          per_replica, slot_of if checkpointed else None,
                          slot_of)

  def _in_graph(self, name, shape, dtype, initializer, extra, per_replica,
                saved_slot_of, slot_of):
    """The variable at the root scope. Reuse only the variable another
    replica of this worker created (MirroredStrategy runs the replicas
    after the first with reuse=True, and they must find its variable),
    whatever the caller's scope says: under a scope with reuse=True the
    first replica creates its state, and under AUTO_REUSE a second build is
    refused, not handed the first one's accumulators."""
    created = graph_state.owned("state_variables", _Created)
    creators = created.creators
    replica = replicas.replica_id()
    reuse = name in creators and creators[name] != replica
    root = tf.compat.v1.VariableScope(reuse=reuse, name="")
    with tf.compat.v1.variable_scope(root, auxiliary_name_scope=False), \
        on_worker(self.local_device):
      try:
        variable = tf.compat.v1.get_variable(
            name, shape=shape, dtype=dtype, trainable=False,
            initializer=initializer, use_resource=True, **extra)
      except ValueError as error:
        if "already exists" not in str(error):
          raise
        raise _exists(name, slot_of, created.owners.get(name)) from error
    if creators.setdefault(name, replica) == replica and per_replica:
      order_saves(variable)
    if saved_slot_of is not None:
      created.owners.setdefault(name, saved_slot_of)
    return variable


def _exists(name, slot_of, owner):
  """The ValueError for a state variable `name` that exists already."""
  if slot_of is not None and owner is not None and owner is not slot_of:
    return ValueError(
        f"the window state {name!r} of variable {slot_of.name} exists "
        f"already for another variable of that name ({owner.name}) in "
        "this graph: two models in one graph have variables of the same "
        "names (a Keras model loaded from a SavedModel into the graph "
        "of the model it was saved from keeps its layer names). Load or "
        "build the second model in a new graph or process, or name its "
        "layers otherwise.")
  return ValueError(
      f"variable {name!r} already exists: build_accumulating_train_op was "
      "called twice for the same variables in one graph. Build one train "
      "op per graph, or pass disjoint var_list values.")


def state_variable(name, shape, dtype, *, per_replica, local_device=None,
                   **options):
  """A state variable made outside a window's build (a batch_norm layer's
  statistics, a wrapper's counter): `StateVariables(local_device)(...)`."""
  return StateVariables(local_device)(name, shape, dtype,
                                      per_replica=per_replica, **options)
