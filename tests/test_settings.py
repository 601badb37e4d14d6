"""WindowSettings: the options checked once into a frozen value."""

import dataclasses

import pytest
import tensorflow as tf

from estimator_accum.options import WindowSettings


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
