"""A model_fn's PREDICT graph as a SavedModel, without tf.estimator.

`export_saved_model` writes what Estimator's `export_saved_model` writes
for a model_fn and a serving input receiver: under `export_dir_base`, a
version directory named by the time (TensorFlow Serving's layout), written
whole under a temporary name first and then renamed, holding the PREDICT
graph, the variables it reads from the checkpoint (no optimizer slot, no
accumulator), the receiver's assets, and one signature per receiver:
`serving_default` and `<alternative>:serving_default`, each mapping the
receiver's tensors to the spec's predictions (or its export outputs).
"""

import os
import time
import typing

import tensorflow as tf

from estimator_accum import releases

__all__ = ["PredictOutput", "ServingInputReceiver", "export_saved_model",
           "serving_input_receiver"]


class ServingInputReceiver(typing.NamedTuple):
  """Estimator's ServingInputReceiver fields, where TensorFlow has no
  Estimator."""
  features: typing.Any
  receiver_tensors: typing.Any
  receiver_tensors_alternatives: typing.Any = None


class PredictOutput:
  """Estimator's PredictOutput: the tensors a serving signature returns
  (a tensor, or a dict of them), for `EstimatorSpec(export_outputs=...)`."""

  def __init__(self, outputs):
    if not isinstance(outputs, dict):
      outputs = {"output": outputs}
    for key, value in outputs.items():
      if not isinstance(key, str) or not tf.is_tensor(value):
        raise ValueError(f"PredictOutput: outputs map names to tensors; got "
                         f"{key!r}: {type(value).__name__}.")
    self.outputs = outputs


def serving_input_receiver(features, receiver_tensors,
                           receiver_tensors_alternatives=None):
  """`tf.estimator.export.ServingInputReceiver(...)` where this TensorFlow
  has Estimator, else the same fields as a `ServingInputReceiver`."""
  estimator = releases.estimator()
  kind = (ServingInputReceiver if estimator is None else
          estimator.export.ServingInputReceiver)
  return kind(features, receiver_tensors, receiver_tensors_alternatives)


def _as_dict(tensors, name):
  return tensors if isinstance(tensors, dict) else {name: tensors}


def _signatures(receiver, spec):
  """{signature name: SignatureDef}, as Estimator names them."""
  outputs = spec.predictions
  exported = getattr(spec, "export_outputs", None)
  if exported:
    outputs = next(iter(exported.values())).outputs
  outputs = _as_dict(outputs, "output")
  receivers = {"serving_default": _as_dict(receiver.receiver_tensors,
                                           "input")}
  for name, tensors in (receiver.receiver_tensors_alternatives or {}).items():
    receivers[f"{name}:serving_default"] = _as_dict(tensors, "input")
  return {name: tf.compat.v1.saved_model.predict_signature_def(
      inputs, outputs) for name, inputs in receivers.items()}


def _version_directory(export_dir_base):
  """A new `<export_dir_base>/<seconds>` (the next second's, if taken)."""
  seconds = int(time.time())
  while tf.io.gfile.exists(os.path.join(export_dir_base, str(seconds))):
    seconds += 1
  return os.path.join(export_dir_base, str(seconds))


def export_saved_model(build_predict, export_dir_base,
                       serving_input_receiver_fn, checkpoint):
  """Writes the SavedModel of the spec `build_predict(features)` makes in
  PREDICT mode, fed by `serving_input_receiver_fn()`, with the variables
  of `checkpoint`; returns the version directory (bytes, as Estimator)."""
  export_dir = _version_directory(export_dir_base)
  temporary = export_dir + ".temp"
  if tf.io.gfile.exists(temporary):
    tf.io.gfile.rmtree(temporary)
  try:
    _write(build_predict, serving_input_receiver_fn, checkpoint, temporary)
  except BaseException:
    # Nothing half written left behind (a full disk, a stop).
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.rmtree(temporary)
    raise
  tf.io.gfile.rename(temporary, export_dir)
  return export_dir.encode()


def _write(build_predict, serving_input_receiver_fn, checkpoint, directory):
  """Writes the SavedModel into `directory`."""
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    receiver = serving_input_receiver_fn()
    spec = build_predict(receiver.features)
    signatures = _signatures(receiver, spec)
    saver = tf.compat.v1.train.Saver(sharded=True)
    with tf.compat.v1.Session() as session:
      saver.restore(session, checkpoint)
      builder = tf.compat.v1.saved_model.Builder(directory)
      builder.add_meta_graph_and_variables(
          session, [tf.saved_model.SERVING], signature_def_map=signatures,
          assets_collection=tf.compat.v1.get_collection(
              tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
          main_op=tf.compat.v1.tables_initializer(), strip_default_attrs=True,
          saver=saver)
      builder.save()
