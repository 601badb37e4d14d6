"""One phase of a TensorFlow 2 Keras job stopped in the middle of a window
(for tests/integration/test_keras_tf2_cluster.py): each phase runs in a process of its
own, as a job restarted after a failure does.

  python tests/jobs/keras_tf2_resume_job.py --phase whole|first|second
      --directory D [--strategy one|mirrored] [--kind new|legacy]
      [--save weights|savedmodel|model_checkpoint|backup|all]

`whole` trains on every micro-batch; `first` on the first STOP ones, then
saves: the weights (`model.save_weights`, the optimizer's window with
them), the model as a SavedModel (`model.save(dir)`), or the model through
`ModelCheckpoint(dir)` every STOP batches (a SavedModel too: no `.keras`
ending); `all` of the three at once, each in a directory of its own (the
tests resume each from one first phase); `second` builds the model anew
and loads the weights, or loads the model (`tf.keras.models.load_model`,
in the strategy's scope), and trains on the rest. With `backup` the job is EPOCHS epochs of STOP
micro-batches (each epoch ends inside a window) under
`BackupAndRestore(dir)`, `first` stopped by an error at the second epoch's
start, `second` the same job fit again, which Keras restores from the
backup. Each writes its weights to D/<phase>.npz.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import estimator_accum as ea  # noqa: E402
from harness import keras_exactness as kx  # noqa: E402

# 4 windows of k=3; the first phase stops one micro-batch into window 2.
K, MICRO_BATCHES, STOP = 3, 12, 4
EPOCHS = MICRO_BATCHES // STOP


class _Count(tf.keras.callbacks.Callback):
  """The micro-batches this process trained on."""
  ran = 0

  def on_train_batch_end(self, batch, logs=None):
    _Count.ran += 1


class _StopAtSecondEpoch(tf.keras.callbacks.Callback):
  def on_epoch_begin(self, epoch, logs=None):
    if epoch == 1:
      raise RuntimeError("stopped")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--phase", choices=["whole", "first", "second"],
                      required=True)
  parser.add_argument("--directory", required=True)
  parser.add_argument("--strategy", choices=["one", "mirrored"],
                      default="one")
  parser.add_argument("--kind", choices=["new", "legacy"], default="new",
                      help="the inner optimizer: Keras's Adam or its legacy "
                      "one")
  parser.add_argument("--save", default="weights",
                      choices=["weights", "savedmodel", "model_checkpoint",
                               "backup", "all"])
  args = parser.parse_args()
  if args.strategy == "mirrored":
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = kx.mirrored_strategy()
  else:
    strategy = tf.distribute.get_strategy()
  batch = strategy.num_replicas_in_sync * kx.MICRO_BATCH
  data = kx.make_data(batch * MICRO_BATCHES)
  dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch)
  adam = (tf.keras.optimizers.Adam if args.kind == "new" else
          tf.keras.optimizers.legacy.Adam)
  checkpoint = os.path.join(args.directory, "weights")
  saved = os.path.join(args.directory, "model")
  checkpointed = os.path.join(args.directory, "checkpointed")
  if args.phase == "second" and args.save in ("savedmodel",
                                             "model_checkpoint"):
    with strategy.scope():
      model = tf.keras.models.load_model(
          saved if args.save == "savedmodel" else checkpointed)
  else:
    model = kx._compiled(  # noqa: SLF001
        lambda: ea.AccumulatingKerasOptimizer(adam(0.01), k=K), strategy,
        True)
  if args.save == "backup":
    _fit_with_backup(model, dataset.take(STOP), args)
  elif args.phase == "whole":
    model.fit(dataset, verbose=0, callbacks=[_Count()])
  elif args.phase == "first":
    callbacks = []
    if args.save in ("model_checkpoint", "all"):
      callbacks = [tf.keras.callbacks.ModelCheckpoint(checkpointed,
                                                      save_freq=STOP)]
    model.fit(dataset.take(STOP), verbose=0, callbacks=[_Count(), *callbacks])
    if args.save in ("weights", "all"):
      model.save_weights(checkpoint)
    if args.save in ("savedmodel", "all"):
      model.save(saved)
  else:
    if args.save == "weights":
      model.load_weights(checkpoint)
    model.fit(dataset.skip(STOP), verbose=0, callbacks=[_Count()])
  np.savez(os.path.join(args.directory, f"{args.phase}.npz"),
           micro_batches=model.optimizer.iterations.numpy(),
           updates=model.optimizer.inner_optimizer.iterations.numpy(),
           ran=_Count.ran,
           # By position: a SavedModel loaded in a strategy's scope names
           # its variables without their layers (two `kernel:0`s).
           **{f"weight_{i}": w.numpy() for i, w in enumerate(model.weights)})
  print(f"{args.phase}: {int(model.optimizer.iterations.numpy())} "
        "micro-batches", flush=True)


def _fit_with_backup(model, epoch, args):
  """EPOCHS epochs of `epoch`; `first` stops at the second one's start."""
  callbacks = [_Count()]
  if args.phase != "whole":
    callbacks.append(tf.keras.callbacks.BackupAndRestore(
        os.path.join(args.directory, "backup")))
  if args.phase == "first":
    callbacks.append(_StopAtSecondEpoch())
  try:
    model.fit(epoch, epochs=EPOCHS, verbose=0, callbacks=callbacks)
  except RuntimeError as error:
    if args.phase != "first" or "stopped" not in str(error):
      raise


if __name__ == "__main__":
  main()
