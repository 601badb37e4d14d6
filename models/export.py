"""The examples' trained models as SavedModels that serving loads.

`export_tensor_model` writes the PREDICT graph of an Estimator's latest
checkpoint under `export_dir/<version>/` (TensorFlow Serving's layout of a
model's base path), its `serving_default` signature taking one float
tensor by name: the images of the MNIST CNN, the features of the housing
regressor. Only the model: no accumulator, window state or optimizer slot
(tests/integration/test_export.py checks). The BERT classifier has its own,
with a text signature (models/bert/export.py).
"""

import os

import tensorflow as tf

import estimator_accum
from estimator_accum import releases
from models import training


def export_tensor_model(model_fn, model_dir, export_dir, name, shape,
                        params=None, dtype=tf.float32):
  """Exports the latest checkpoint in `model_dir` of `model_fn`; its input
  `name` is `dtype` [batch, *shape]. Returns the version directory."""
  estimator = training.estimator(model_fn, model_dir=model_dir,
                                 config=_local_config(), params=params)
  tf_estimator = releases.estimator()

  def receiver():
    inputs = tf.compat.v1.placeholder(dtype, [None, *shape], name=name)
    # The features are the tensor itself, not a dict: tf.estimator's
    # TensorServingInputReceiver, or the library's receiver (2.16+).
    if tf_estimator is not None:
      return tf_estimator.export.TensorServingInputReceiver(inputs,
                                                            {name: inputs})
    return estimator_accum.ServingInputReceiver(inputs, {name: inputs})

  path = estimator.export_saved_model(export_dir, receiver)
  return path.decode() if isinstance(path, bytes) else path


def _local_config():
  """A RunConfig of this process alone: the export needs no cluster, and
  tf.estimator's RunConfig, which reads TF_CONFIG as it is made, refuses
  a cluster of workers without a chief (the MNIST job's). TF_CONFIG is
  set aside for that moment only."""
  saved = {name: os.environ.pop(name) for name in ("TF_CONFIG",
                                                   "CLUSTER_SPEC")
           if name in os.environ}
  try:
    return estimator_accum.RunConfig()
  finally:
    os.environ.update(saved)
