"""Keras 3's own gradient_accumulation_steps beside AccumulatingKerasOptimizer
on Keras 3 and on tf-keras, each against its Keras's plain big batch, case
by case.

One process per column (TensorFlow chooses Keras 3 or tf-keras when it is
imported, by TF_USE_LEGACY_KERAS), on the same data, model and seeds:
k=4 micro-batches of 8 against batches of 32, `model.fit`, from the same
initial weights. Printed per case: the largest relative difference of any
weight, moving statistics included, from the big batch's (|a - b| /
(|b| + 0.1); 1e-5 is exact in float32), or the error the case raised.

- adam: a dense model, Adam.
- uneven last micro-batch: 60 examples, so the big batches are 32 and 28
  and the second window's last micro-batch holds 4 examples.
- batch norm: BatchNormalization after the first layer. The micro-batches
  normalize by their own statistics, so the reference of the library's
  WindowBatchNormalization is Keras 2's ghost batch norm
  (`virtual_batch_size=8`, from tf-keras, in the Keras 3 process too, from
  the same initial weights); Keras 3's own accumulation, with Keras 3's
  BatchNormalization (it has no ghost batch norm), is compared with its
  plain big batch.
- mixed_float16: the policy and Keras's LossScaleOptimizer, both sides.
- mirrored: MirroredStrategy over 2 logical CPUs, global batches.

Needs TensorFlow 2.16+ with tf-keras (./setup.sh newest):

  .venv-newest/bin/python benchmarks/keras3_accumulation.py
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

K, MICRO_BATCH = 4, 8
CASES = ("adam", "uneven last micro-batch", "batch norm", "mixed_float16",
         "mirrored")
# Each column: (TF_USE_LEGACY_KERAS, whether the library's wrapper runs).
KERASES = {"Keras 3, gradient_accumulation_steps=4": ("0", False),
           "Keras 3, AccumulatingKerasOptimizer(k=4)": ("0", True),
           "tf-keras, AccumulatingKerasOptimizer(k=4)": ("1", True)}


def _run_case(case, ours):
  """{"difference": float} or {"error": str} for `case` in this process's
  Keras (`ours`: the library's wrapper accumulates, else Keras 3's own)."""
  import numpy as np  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415

  import estimator_accum  # noqa: PLC0415

  keras3 = estimator_accum.releases.keras_major() >= 3
  examples = 60 if case == "uneven last micro-batch" else 96
  rng = np.random.RandomState(0)
  x = rng.normal(size=(examples, 6)).astype(np.float32)
  y = rng.randint(0, 3, size=examples)
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
              if case == "mirrored" else tf.distribute.get_strategy())

  # The reference of WindowBatchNormalization: Keras 2's ghost batch norm.
  ghost = case == "batch norm" and (ours or not keras3)
  reference_keras = tf.keras
  if ghost and keras3:
    import tf_keras as reference_keras  # noqa: PLC0415

  def model(accumulating):
    keras = tf.keras if accumulating else reference_keras
    tf.keras.utils.set_random_seed(1)
    # No bias before a batch norm: its gradient is rounding noise, which
    # Adam turns into steps of the learning rate's size.
    layers = [keras.Input((6,)),
              keras.layers.Dense(16, use_bias=case != "batch norm")]
    if case == "batch norm":
      if not ghost:
        layers.append(keras.layers.BatchNormalization())
      elif accumulating:
        layers.append(estimator_accum.WindowBatchNormalization(k=K))
      else:
        layers.append(keras.layers.BatchNormalization(
            virtual_batch_size=MICRO_BATCH))
    layers += [keras.layers.Activation("tanh"), keras.layers.Dense(3)]
    return keras.Sequential(layers)

  # The accumulating model's initial weights (its window's sums left out),
  # set into the reference, which may be of the other Keras.
  initial = [w.numpy() for w in model(True).weights
             if not w.name.split("/")[-1].startswith("window_")]

  def trained(accumulating):
    keras = tf.keras if accumulating else reference_keras
    if case == "mixed_float16":
      tf.keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
      made = model(accumulating)
      if not accumulating:
        made.set_weights([np.reshape(w, v.shape)
                          for w, v in zip(initial, made.get_weights())])
      optimizer = keras.optimizers.Adam(0.01)
      if accumulating and keras3 and not ours:
        optimizer = tf.keras.optimizers.Adam(
            0.01, gradient_accumulation_steps=K)
      # tf-keras's wrapper scales the loss itself, around a loss-scale
      # optimizer; Keras 3's is wrapped in one, as compile wraps it.
      if case == "mixed_float16" and not (accumulating and ours and keras3):
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
      if accumulating and ours:
        optimizer = estimator_accum.AccumulatingKerasOptimizer(optimizer, k=K)
        if case == "mixed_float16" and keras3:
          optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
      made.compile(optimizer=optimizer, loss=keras.losses.
                   SparseCategoricalCrossentropy(from_logits=True))
    batch = MICRO_BATCH if accumulating else K * MICRO_BATCH
    inputs, labels = x, y
    if ghost and not accumulating:
      # Keras's virtual batch j of a batch holds its examples j, j + k, ...:
      # interleaved, its virtual batches are the micro-batches.
      inputs, labels = (np.concatenate([
          np.stack(np.split(part, K), axis=1).reshape((-1,) + part.shape[1:])
          for part in np.split(values, len(values) // (K * MICRO_BATCH))])
          for values in (x, y))
    made.fit(inputs, labels, batch_size=batch, epochs=1, shuffle=False,
             verbose=0)
    tf.keras.mixed_precision.set_global_policy("float32")
    # By layer and weight name: a window's layer may hold more state.
    return {(index, weight.name.split("/")[-1].split(":")[0]):
            weight.numpy().ravel()
            for index, layer in enumerate(made.layers)
            for weight in layer.weights}

  try:
    big, accumulated = trained(False), trained(True)
  except Exception as error:  # noqa: BLE001  the case's figure is its error
    return {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
  return {"difference": max(
      float(np.max(np.abs(accumulated[key] - value) / (np.abs(value) + 0.1)))
      for key, value in big.items())}


def _child(ours):
  import tensorflow as tf  # noqa: PLC0415

  tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * 2)
  for case in CASES:
    print(json.dumps({"case": case, **_run_case(case, ours)}), flush=True)


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--child", choices=("own", "ours"),
                      help="run the cases in this process's Keras (internal)")
  args = parser.parse_args()
  if args.child:
    _child(args.child == "ours")
    return 0
  rows = bench.Rows("Keras 3's accumulation and ours, against the big batch",
                    args.json, markdown=True)
  results = {}
  for name, (legacy, ours) in KERASES.items():
    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child",
         "ours" if ours else "own"],
        env=dict(os.environ, TF_USE_LEGACY_KERAS=legacy),
        capture_output=True, text=True, timeout=900, check=False)
    lines = [json.loads(line) for line in run.stdout.splitlines()
             if line.startswith("{")]
    if run.returncode != 0 or len(lines) != len(CASES):
      rows.fail(f"{name}: exit {run.returncode}: {run.stderr[-1500:]}")
      return rows.exit_code()
    results[name] = {line["case"]: line for line in lines}
  for case in CASES:
    row = {"case": case}
    for name in KERASES:
      found = results[name][case]
      row[name] = (f"{found['difference']:.1e}" if "difference" in found
                   else found["error"][:90])
    rows.add(**row)
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
