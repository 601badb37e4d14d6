"""What estimator_accum keeps per `tf.Graph`: entries each owned by one module.

`graph_state.owned(key, factory)` returns the default graph's entry `key`,
made with `factory()` on first use: the one place the registry is read.
Each key has one owner, the module listed in `OWNERS`, and only that
module asks for it (`tests/test_design.py` reads every call and checks);
other modules call functions of the owner.

The entries live in one dict on the graph itself, the library's one
attribute on a `tf.Graph`: per-graph state must live and die with its graph.
Not a graph collection: collections are exported with every checkpoint's
meta graph, which cannot hold Python objects. Not a WeakKeyDictionary keyed
by the graph either: the values hold the graph's variables, which hold the
graph, so the key would never die and every graph built (Estimator builds
one per train() call) would stay in memory for the life of the process.
"""

import tensorflow as tf

_ATTRIBUTE = "_estimator_accum"

# key -> (owning module, what it holds)
OWNERS = {
    "accumulation": ("estimator_accum.window.train_op",
                     "the AccumulationState of the graph's first train op, "
                     "and the counter each train op claimed"),
    "window_statistics": ("estimator_accum.window.batch_norm",
                          "each batch_norm layer's WindowStatistics, until "
                          "a train op claims them"),
    "window_copies": ("estimator_accum.window.window_copies",
                      "each variable's narrow copy made by "
                      "cast_once_per_window, and the train op remaking it"),
    "reported_losses": ("estimator_accum.window.reports",
                        "the losses reportable_loss was given"),
    "progress": ("estimator_accum.window.progress",
                 "the graph's progress line and the train op writing it"),
    "warned_hyperparameters": ("estimator_accum.window.step_counting",
                               "hyperparameters already warned about"),
    "state_variables": ("estimator_accum.checkpoints.state_variables",
                        "which replica created each state variable, and "
                        "whose state it is"),
    "function_variables": ("estimator_accum.checkpoints.function_variables",
                           "the wrappers building their window in this "
                           "tf.function graph"),
    "save_barriers": ("estimator_accum.checkpoints.ordered_saves",
                      "each multi-worker save's barrier op"),
    "worker_losses": ("estimator_accum.distribution.workers",
                      "reportable_loss's per-replica calls and groups"),
    "default_names": ("estimator_accum.integrations.wrappers",
                      "the default window names handed to each replica"),
}


def owned(key, factory, graph=None):
  """The entry `key` of `graph` (default: the default graph), made with
  `factory()` on first use.

  Raises:
    KeyError: `key` is not in OWNERS.
  """
  if key not in OWNERS:
    raise KeyError(f"graph state {key!r} has no owner in graph_state.OWNERS")
  graph = graph or tf.compat.v1.get_default_graph()
  entries = getattr(graph, _ATTRIBUTE, None)
  if entries is None:
    entries = {}
    setattr(graph, _ATTRIBUTE, entries)
  if key not in entries:
    entries[key] = factory()
  return entries[key]
