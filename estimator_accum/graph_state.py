"""Per-graph state of estimator_accum, kept on the `tf.Graph` it belongs to.

Not a graph collection: collections are exported with every checkpoint's
meta graph, which cannot hold Python objects. Not a WeakKeyDictionary keyed
by the graph either: the values hold the graph's variables, which hold the
graph, so the key would never die.
"""

import tensorflow as tf


def graph_registry(attribute):
  """The dict the default graph keeps in `attribute` (made empty at first)."""
  graph = tf.compat.v1.get_default_graph()
  registry = getattr(graph, attribute, None)
  if registry is None:
    registry = {}
    setattr(graph, attribute, registry)
  return registry
