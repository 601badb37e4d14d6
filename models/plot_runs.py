"""Plots the training loss of several Estimator runs against examples seen.

  python -m models.plot_runs --output loss.png RUN_DIR [RUN_DIR ...]

Reads each run's TensorBoard event files (the `loss` scalar Estimator writes)
and its run_info.json (`label`, `examples_per_step`, `k`, written by the
example commands); without run_info.json the label is the folder name and
--examples_per_step applies. Accumulated and plain runs then line up on the
same x axis: a micro-batch step of an accumulated run sees fewer examples
than a step of its big-batch twin.

An accumulated run (k > 1) is drawn as the mean loss of each window, one
point per update: the mean of k equal micro-batches' mean losses is the
loss of the big batch they make up, at the same weights. So a run of
micro-batch 8 with k=4 lies on its batch-32 twin, as its training does; its
noisier micro-batch losses would only show that 8 examples are fewer than
32. That needs the loss of every micro-batch (save_summary_steps=1).
"""

import glob
import json
import os
import sys

import matplotlib
import tensorflow as tf
from absl import app, flags

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output", "loss.png", "PNG file to write.")
flags.DEFINE_integer("examples_per_step", None, "For runs without "
                     "run_info.json: examples per global step.")
flags.DEFINE_string("title", "Training loss: accumulated vs plain batches",
                    "Figure title.")
flags.DEFINE_string("tag", "loss", "Scalar tag to plot.")


def read_scalars(run_dir, tag="loss"):
  """[(step, value)] of `tag` in the run's event files, sorted by step."""
  points = {}
  for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          points[event.step] = value.simple_value
  return sorted(points.items())


def window_means(points, k):
  """[(step after the window, mean loss)] of each whole window of k
  consecutive micro-batch steps; the windows start at steps 0, k, 2k, ...
  (or 1, k+1, ... when the first step logged is 1)."""
  offset = 1 if points and points[0][0] == 1 else 0
  windows = {}
  for step, value in points:
    windows.setdefault((step - offset) // k, []).append(value)
  return [((window + 1) * k, sum(values) / k)
          for window, values in sorted(windows.items()) if len(values) == k]


def run_info(run_dir, examples_per_step=None):
  path = os.path.join(run_dir, "run_info.json")
  if os.path.exists(path):
    with open(path) as reader:
      return json.load(reader)
  if examples_per_step is None:
    raise ValueError(f"{run_dir} has no run_info.json; pass "
                     f"--examples_per_step.")
  return {"label": os.path.basename(os.path.normpath(run_dir)),
          "examples_per_step": examples_per_step}


def plot(run_dirs, output, title, tag="loss", examples_per_step=None):
  """Writes the PNG; returns the number of curves drawn."""
  figure, axes = pyplot.subplots(figsize=(8, 5), dpi=100)
  drawn = 0
  for run_dir in run_dirs:
    info = run_info(run_dir, examples_per_step)
    points = read_scalars(run_dir, tag)
    if not points:
      raise ValueError(f"{run_dir} has no '{tag}' scalars in its event "
                       f"files.")
    k = info.get("k", 1)
    if k > 1:
      points = window_means(points, k)
    steps, values = zip(*points, strict=True)
    # Wide and pale under the thin plain runs: where they agree, both show.
    axes.plot([s * info["examples_per_step"] for s in steps], values,
              label=info["label"] + (" (window means)" if k > 1 else ""),
              linewidth=5 if k > 1 else 1.5, alpha=0.4 if k > 1 else 0.9,
              zorder=1 if k > 1 else 2)
    drawn += 1
  axes.set_title(title)
  axes.set_xlabel("training examples seen")
  axes.set_ylabel(f"{tag} (batch mean; window mean for k > 1)")
  axes.grid(alpha=0.3)
  axes.legend()
  figure.tight_layout()
  figure.savefig(output, format="png")
  pyplot.close(figure)
  return drawn


def main(argv):
  run_dirs = argv[1:]
  if not run_dirs:
    sys.exit("plot_runs: error: give one or more run directories.")
  try:
    drawn = plot(run_dirs, FLAGS.output, FLAGS.title, FLAGS.tag,
                 FLAGS.examples_per_step)
  except (ValueError, OSError) as error:
    sys.exit(f"plot_runs: error: {error}")
  print(f"wrote {FLAGS.output} ({drawn} runs)")


if __name__ == "__main__":
  app.run(main)
