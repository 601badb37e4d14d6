"""The examples' trained models as SavedModels that serving loads.

`export_tensor_model` writes the PREDICT graph of an Estimator's latest
checkpoint under `export_dir/<version>/` (TensorFlow Serving's layout of a
model's base path), its `serving_default` signature taking one float
tensor by name: the images of the MNIST CNN, the features of the housing
regressor. Only the model: no accumulator, window state or optimizer slot
(tests/integration/test_export.py checks). The BERT classifier has its own,
with a text signature (models/bert/export.py).
"""

import tensorflow as tf


def export_tensor_model(model_fn, model_dir, export_dir, name, shape,
                        params=None, dtype=tf.float32):
  """Exports the latest checkpoint in `model_dir` of `model_fn`; its input
  `name` is `dtype` [batch, *shape]. Returns the version directory."""
  estimator = tf.estimator.Estimator(model_fn, model_dir=model_dir,
                                     params=params)

  def receiver():
    inputs = tf.compat.v1.placeholder(dtype, [None, *shape], name=name)
    return tf.estimator.export.TensorServingInputReceiver(inputs,
                                                          {name: inputs})

  path = estimator.export_saved_model(export_dir, receiver)
  return path.decode() if isinstance(path, bytes) else path
