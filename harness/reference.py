"""docs/reference.md, written from the code: the public names (each
module's `__all__` and the first paragraph of each docstring), the window
options (`estimator_accum.options.OPTIONS`, the one table the entry points
take) and run_classifier.py's flags (their absl definitions).
tests/unit/test_docs.py fails when the page and the code differ.

    python -m harness.reference > docs/reference.md
"""

import importlib
import inspect
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODULES = ("estimator_accum", "estimator_accum.estimator",
           "estimator_accum.keras")
HEADER = """# Reference

Written from the code by `python -m harness.reference > docs/reference.md`
(tests/unit/test_docs.py checks that it is current). The how-to pages are
the [user guide](user_guide.md), [Keras](keras.md),
[distributed](distributed.md), [BERT](bert.md) and
[operations](operations.md).

A name here stays for at least one release after it moves, with a
`DeprecationWarning` that names its new home
(`tests/unit/test_public_names.py`).
"""


def _summary(value):
  """The first paragraph of `value`'s docstring, on one line."""
  doc = inspect.getdoc(value) or ""
  first = doc.split("\n\n")[0]
  return " ".join(first.split()).replace("|", "\\|")


# Names whose object differs by release, described once for every release.
_RELEASE_NAMES = {
    "EstimatorSpec": ("estimator_accum.estimator.specs", "EstimatorSpec"),
    "ModeKeys": ("estimator_accum.estimator.specs", "ModeKeys"),
    "RunConfig": ("estimator_accum.estimator.run_config", "RunConfig"),
    "ServingInputReceiver": ("estimator_accum.estimator.export",
                             "ServingInputReceiver"),
    "PredictOutput": ("estimator_accum.estimator.export", "PredictOutput"),
}
_KERAS_NAMES = {
    "BackupAndRestore": "Keras's `BackupAndRestore` callback (the same "
                        "arguments), its newest backup checked before Keras "
                        "restores it and the one before it kept.",
    "WindowBatchNormalization": "Keras's ghost batch normalization for a "
                                "window: each micro-batch normalized alone, "
                                "the moving statistics moved once per "
                                "window, as the big batch's.",
}


def _described(name, value):
  if name == "SPARSE_THRESHOLD_BYTES":
    return ("int: the table size from which sparse_accumulation=\"auto\" "
            "accumulates compactly")
  if name in _KERAS_NAMES:
    return _KERAS_NAMES[name] + " Keras 2's or Keras 3's, as `tf.keras` is."
  if name in _RELEASE_NAMES:
    module, attribute = _RELEASE_NAMES[name]
    own = getattr(importlib.import_module(module), attribute)
    return (_summary(own) + f" On TensorFlow 2.15 it is tf.estimator's "
            f"own `{name}`.")
  return _summary(value)


def _names(module_name):
  module = importlib.import_module(module_name)
  lines = [f"## `{module_name}`", "", "| name | what it is |", "| --- | --- |"]
  for name in sorted(module.__all__, key=str.lower):
    what = _described(name, getattr(module, name))
    lines.append(f"| `{name}` | {what} |")
  return lines


def _options():
  from estimator_accum import options  # noqa: PLC0415

  lines = ["## The window's options", "",
           "`build_accumulating_train_op(loss, optimizer, k, ...)`, "
           "`AccumulatingOptimizer(optimizer, k, ...)` and "
           "`AccumulatingKerasOptimizer(optimizer, k, ...)` take each as a "
           "keyword argument, from one table (`estimator_accum/options.py`). "
           "The two wrappers default `reduction` and `name` to None (the "
           "loss's own reduction, and the next free default name), and "
           "`AccumulatingKerasOptimizer` defaults `reduction` to \"mean\" "
           "and `loss_scale` to \"auto\".", "",
           "| option | default | what it does |", "| --- | --- | --- |"]
  for option in options.OPTIONS:
    default = getattr(option.default, "name", option.default)
    doc = " ".join(option.doc.split()).replace("|", "\\|")
    lines.append(f"| `{option.name}` | `{default!r}` | {doc} |")
  return lines


def _flags():
  from absl import flags  # noqa: PLC0415

  module = importlib.import_module("models.bert.classifier_flags")
  defined = flags.FLAGS.flags_by_module_dict()[module.__name__]
  lines = ["## `run_classifier.py`'s flags", "",
           "Google's BERT flags (its TPU flags accepted and unused) and the "
           "accumulation's (`models/bert/classifier_flags.py`).", "",
           "| flag | default | what it does |", "| --- | --- | --- |"]
  for flag in sorted(defined, key=lambda f: f.name):
    doc = " ".join((flag.help or "").split()).replace("|", "\\|")
    lines.append(f"| `--{flag.name}` | `{flag.default!r}` | {doc} |")
  return lines


def render():
  """The page's text."""
  lines = [HEADER]
  for module in MODULES:
    lines += _names(module) + [""]
  lines += _options() + [""] + _flags()
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.stdout.write(render())
