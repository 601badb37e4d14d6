"""WindowSettings: the options checked once into a frozen value."""

import dataclasses
import inspect
import pathlib
import re

import pytest
import tensorflow as tf

import estimator_accum
import estimator_accum.options
from estimator_accum.options import OPTION_NAMES, WindowSettings


def test_checked_normalizes_and_freezes():
  settings = WindowSettings.checked(4, clip_norm=1, accumulator_dtype="float32")
  assert settings.k == 4 and settings.clip_norm == 1.0
  assert settings.accumulator_dtype == tf.float32
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.k = 5  # noqa: B003 (the point: it cannot be set)
  with pytest.raises(TypeError):
    settings.gradient_options["colocate_gradients_with_ops"] = True


@pytest.mark.parametrize("options, error, text", [
    (dict(k=0), ValueError, "k must be >= 1"),
    (dict(k=2, clip_norm=-1.0), ValueError, "clip_norm"),
    (dict(k=2, reduction="median"), ValueError, "reduction"),
    (dict(k=2, after_update=3), TypeError, "after_update must be a callable"),
    (dict(k=2, max_consecutive_skipped_windows=0), ValueError,
     "max_consecutive_skipped_windows"),
    (dict(k=2, bogus=1), TypeError, "unknown window settings: ['bogus']"),
])
def test_each_bad_option_is_named(options, error, text):
  with pytest.raises(error) as raised:
    WindowSettings.checked(**options)
  assert text in str(raised.value)


def test_replace_checks_the_change():
  settings = WindowSettings.checked(2)
  assert settings.replace(name="other").name == "other"
  with pytest.raises(ValueError, match="k must be >= 1"):
    settings.replace(k=0)


# The entry points and the arguments of their own, besides the options.
ENTRY_POINTS = [
    (estimator_accum.build_accumulating_train_op,
     {"loss", "optimizer", "k", "global_step", "var_list", "num_examples",
      "colocate_gradients_with_ops"}),
    (estimator_accum.AccumulatingOptimizer, {"optimizer", "k"}),
    (estimator_accum.AccumulatingKerasOptimizer, {"optimizer", "k"}),
]


@pytest.mark.parametrize("entry, own", ENTRY_POINTS,
                         ids=lambda e: getattr(e, "__name__", ""))
def test_every_entry_point_takes_the_options_of_the_table(entry, own):
  parameters = inspect.signature(entry).parameters
  names = set(parameters) - {"self"}
  assert names - own == set(OPTION_NAMES)
  # Keyword-only, with the table's defaults but where the entry point says
  # otherwise (the wrappers leave reduction and name to each graph).
  overrides = getattr(entry, "_OPTION_DEFAULTS", {})
  for name in OPTION_NAMES:
    parameter = parameters[name]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
    expected = overrides.get(name, estimator_accum.options.DEFAULTS[name])
    assert parameter.default == expected, (name, parameter.default)
    # Named in the docstring, which points to the table's documentation.
    assert name in entry.__doc__, name
  assert "estimator_accum.options.OPTIONS" in entry.__doc__


def _given_each_option():
  """A value other than the default for every option."""
  return dict(
      clip_norm=2.0, reduction="sum", accumulator_dtype="float32",
      accumulator_placement="host",
      summaries=False, loss_scale=128.0, sparse_accumulation=False,
      sparse_threshold_bytes=1024,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          bytes_per_pack=1024),
      table_all_reduce="dense", communication_dtype="bfloat16",
      overlap_backward=False, sequential_apply=False, fused_apply=True,
      after_update=lambda: None,
      log_every_n_micro_batches=7,
      max_consecutive_skipped_windows=3, name="window")


def test_the_test_gives_every_option():
  assert set(_given_each_option()) == set(OPTION_NAMES)


@pytest.mark.keras2
@pytest.mark.parametrize("wrapper, inner", [
    (estimator_accum.AccumulatingOptimizer,
     lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1)),
    (estimator_accum.AccumulatingKerasOptimizer,
     lambda: tf.keras.optimizers.legacy.SGD(0.1)),
])
def test_the_wrappers_keep_every_option(wrapper, inner):
  given = _given_each_option()
  settings = wrapper(inner(), 3, **given)._window._settings  # noqa: SLF001
  for name, value in given.items():
    if name in ("accumulator_dtype", "communication_dtype"):
      value = tf.as_dtype(value)
    assert getattr(settings, name) == value, name


def test_build_accumulating_train_op_keeps_every_option():
  given = _given_each_option()
  given.pop("loss_scale")  # (GradientDescent with a fixed scale: below)
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("w", [2], tf.float32)
    loss = tf.reduce_sum(variable)
    estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(0.1), 3,
        loss_scale=128.0, **given)
    state = estimator_accum.get_accumulation_state()
    assert state.k == 3
    assert state.loss_scale is not None
    assert state.updates_applied.name.startswith("window/")


@pytest.mark.keras2
@pytest.mark.parametrize("entry", [e for e, _ in ENTRY_POINTS],
                         ids=lambda e: e.__name__)
def test_an_unknown_option_is_named_by_every_entry_point(entry):
  with tf.Graph().as_default(), pytest.raises(TypeError, match="bogus"):
    loss = tf.reduce_sum(tf.compat.v1.get_variable("w", [2], tf.float32))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    if entry is estimator_accum.build_accumulating_train_op:
      entry(loss, optimizer, 2, bogus=1)
    else:
      entry(optimizer, 2, bogus=1)


def test_the_reference_lists_every_option_with_its_default():
  reference = (pathlib.Path(__file__).resolve().parents[2] / "docs" /
               "reference.md").read_text()
  table = reference[reference.index("## The window's options"):]
  table = table[:table.index("\n## ")]
  rows = re.findall(r"^\| `(\w+)` \| `(.+?)` \|", table, re.M)
  assert [name for name, _ in rows] == list(OPTION_NAMES)
  for name, default in rows:
    expected = estimator_accum.options.DEFAULTS[name]
    if name == "accumulator_dtype":
      assert default == "'float32'" and expected == tf.float32
    else:
      assert default == repr(expected), name
