"""Everything estimator_accum keeps per `tf.Graph`, in one object.

`graph_state.of(graph)` returns the graph's `GraphState`, made empty on
first use; every module reads and writes its part there, by name.

It is kept on the graph itself. Not a graph collection: collections are
exported with every checkpoint's meta graph, which cannot hold Python
objects. Not a WeakKeyDictionary keyed by the graph either: the values hold
the graph's variables, which hold the graph, so the key would never die and
every graph built (Estimator builds one per train() call) would stay in
memory for the life of the process.
"""

import dataclasses

import tensorflow as tf

_ATTRIBUTE = "_estimator_accum"


@dataclasses.dataclass
class GraphState:
  """What one graph holds for estimator_accum.

  Fields:
    accumulation: the `AccumulationState` of the graph's first accumulating
      train op, or None before one is built.
    counters: {counter variable name: name of the train op counting it}.
    state_creators: {window state variable name: the replica id (None in
      cross-replica context) that created it}.
    state_owners: {window state variable name: the trained variable whose
      state it is}, for the state that is one variable's.
    window_statistics: {batch_norm scope: its `WindowStatistics`}.
    progress: (train op name, `ProgressLine`) of the graph's first train op
      with a progress line, or None.
    save_barriers: {checkpoint prefix tensor's name: that save's barrier op}
      (multi-worker saves, `ordered_saves`).
    worker_losses: `reportable_loss`'s per-replica calls and their groups.
    default_names: {replica id: the default names its windows were given}.
  """

  accumulation: object = None
  counters: dict = dataclasses.field(default_factory=dict)
  state_creators: dict = dataclasses.field(default_factory=dict)
  state_owners: dict = dataclasses.field(default_factory=dict)
  window_statistics: dict = dataclasses.field(default_factory=dict)
  progress: tuple = None
  save_barriers: dict = dataclasses.field(default_factory=dict)
  worker_losses: dict = dataclasses.field(default_factory=dict)
  default_names: dict = dataclasses.field(default_factory=dict)


def of(graph=None):
  """The `GraphState` of `graph` (default: the default graph)."""
  graph = graph or tf.compat.v1.get_default_graph()
  state = getattr(graph, _ATTRIBUTE, None)
  if state is None:
    state = GraphState()
    setattr(graph, _ATTRIBUTE, state)
  return state
