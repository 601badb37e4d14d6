"""`LeanCheckpointSaverHook`: TensorFlow's checkpoint saver without its save
at the start of a run that has trained nothing.

`tf.compat.v1.train.CheckpointSaverHook` (the one Estimator adds) saves as
soon as the session exists, whatever the global step, and serializes the
graph twice for the events file (a GraphDef and a MetaGraphDef of the same
graph, besides the one its summary writer wrote when it was made). At
global step 0 that checkpoint holds the initial values, which a new run
rebuilds alike (its seed, its init checkpoint): resuming from it is
starting again. For the main job (MiniLM, AdamW, k=4) it wrote 348 MB (the
weights, Adam's two slots and the window's sums) and took 1.3 s of the
start, measured. This hook skips that save and the two serializations at
global step 0 (the events file keeps the graph its writer wrote); from a
resumed step it does what TensorFlow's does. Every later save (every
`save_steps`, at the end, and the listeners around each) is
TensorFlow's.

    hook = LeanCheckpointSaverHook(model_dir, save_steps=1000)
    estimator.train(input_fn, max_steps=n, hooks=[hook])  # Estimator then
                                                           # adds no saver
"""

import tensorflow as tf

__all__ = ["LeanCheckpointSaverHook"]


class LeanCheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
  """`tf.compat.v1.train.CheckpointSaverHook` (the same arguments) that
  does not save at the session's creation while the global step is 0."""

  def after_create_session(self, session, coord):
    global_step = session.run(self._global_step_tensor)
    if global_step != 0:
      super().after_create_session(session, coord)
      return
    if self._save_graph_def:
      tf.io.write_graph(session.graph.as_graph_def(add_shapes=True),
                        self._checkpoint_dir, "graph.pbtxt")
    # TensorBoard's graph: the events file has it already (its writer,
    # `SummaryWriterCache`'s, wrote the graph when it was made).
    # The next save is `save_steps` on, as after TensorFlow's first save.
    self._timer.update_last_triggered_step(global_step)
