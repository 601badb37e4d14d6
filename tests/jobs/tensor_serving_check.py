"""Checks an example's exported model in a process of its own (for tests):

  python tests/jobs/tensor_serving_check.py housing|mnist RUN_DIR EXPORT

Runs the SavedModel's serving_default (tf.saved_model.load) and Estimator's
predict on RUN_DIR's checkpoint over held-out examples, and prints one JSON
line: the largest absolute difference of each output, and the variables
the SavedModel holds.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def _held_out(example):
  if example == "housing":
    from data import housing  # noqa: PLC0415
    from models.housing.model import model_fn  # noqa: PLC0415
    _, evaluation = housing.load_housing(None)
    return model_fn, "features", evaluation["x"][:64].astype(np.float32)
  from data import mnist  # noqa: PLC0415
  from models.mnist.model import model_fn  # noqa: PLC0415
  _, test = mnist.load()
  return model_fn, "images", test["images"][:64].astype(np.float32)


def main():
  example, run_dir, export_path = sys.argv[1:4]
  model_fn, name, inputs = _held_out(example)
  served = tf.saved_model.load(export_path).signatures["serving_default"](
      **{name: tf.constant(inputs)})
  estimator = tf.estimator.Estimator(model_fn, model_dir=run_dir,
                                     params=dict(k=1, learning_rate=0.0))
  predicted = list(estimator.predict(
      lambda: tf.data.Dataset.from_tensor_slices(inputs).batch(16)))
  differences = {
      key: float(np.max(np.abs(served[key].numpy() -
                               np.stack([p[key] for p in predicted]))))
      for key in predicted[0]}
  print("RESULT " + json.dumps({
      "differences": differences, "examples": len(predicted),
      "variables": [n for n, _ in tf.train.list_variables(
          os.path.join(export_path, "variables", "variables"))]}))


if __name__ == "__main__":
  main()
