"""An `AccumulatingKerasOptimizer`'s state in a Keras SavedModel.

`model.save("dir")` (TensorFlow 2.15's Keras writes a SavedModel when the
path has no `.keras`/`.h5` ending; so does `ModelCheckpoint`) and
`tf.keras.models.load_model("dir")` compile the loaded model with an
optimizer made anew from its config: Keras tells it nothing of the file,
and its own optimizers start afresh there (measured: Adam's update count 0
after load_model, its moments zero). The wrapper keeps the window, so its
state must come back, or the next update is not the big batch's.

So the wrapper's SavedModel holds, beside what Keras saves of it, one child
`estimator_accum_state` with its whole state by key (as its `.keras` file or
`get_weights` keep it: the micro-batch count, the inner optimizer's, the
window's), as plain variables (a process that never imports estimator_accum
loads and serves the SavedModel: TensorFlow revives it as a plain object),
and the wrapper Keras's loader makes reads it back from the file being
loaded.
"""

import os
import urllib.parse

import tensorflow as tf

from estimator_accum import tf_private

__all__ = ["CHILD", "holder", "read"]

CHILD = "estimator_accum_state"
def _local_name(key):
  # Quoted, and no "." either: TensorFlow escapes "." and "/" in keys.
  return urllib.parse.quote(key, safe="").replace(".", "%2E")


def holder(variables):
  """A trackable with each of `variables` ({key: variable}) as a child."""
  made = tf.__internal__.tracking.AutoTrackable()
  for key, variable in variables.items():
    tf_private.track_child(made, _local_name(key), variable)
  return made


def read(path):
  """{key: value} of the wrapper's state in the SavedModel at `path`, or
  None when it holds none (saved by a version of the project before this
  one, or without the optimizer). Found through the checkpoint's object
  graph: a variable is stored once, under the first path to it (the
  micro-batch count under `optimizer/_iterations`), whatever else holds
  it."""
  try:
    reader = tf.train.load_checkpoint(os.path.join(path, "variables",
                                                   "variables"))
    graph = tf_private.checkpoint_object_graph(reader)
  except (tf.errors.OpError, ValueError):
    return None

  def child(node, name):
    found = [c.node_id for c in node.children if c.local_name == name]
    return graph.nodes[found[0]] if found else None

  # Keras saves the model as the root, its optimizer as "optimizer".
  state = child(graph.nodes[0], "optimizer")
  state = state and child(state, CHILD)
  if state is None:
    return None
  found = {}
  for reference in state.children:
    keys = [a.checkpoint_key for a in graph.nodes[reference.node_id]
            .attributes if a.name == "VARIABLE_VALUE"]
    if keys:
      found[urllib.parse.unquote(reference.local_name)] = reader.get_tensor(
          keys[0])
  return found or None
