"""Loaded by every Python process of a test session (tests/conftest.py puts
this folder on PYTHONPATH): starts its Python children through the
session's fork servers (tests/helpers/fork_start.py), and runs its
TensorFlow sessions as the suite does (tests/helpers/grappler.py). Loads
those modules by their paths, adding nothing to sys.path."""

import importlib.util
import os
import sys

_HELPERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
  spec = importlib.util.spec_from_file_location(
      f"_estimator_accum_test_{name}", os.path.join(_HELPERS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


if os.environ.get("ESTIMATOR_ACCUM_TEST_GRAPPLER"):
  _load("grappler").install()
if os.environ.get("ESTIMATOR_ACCUM_TEST_FORK_DIR") and (
    os.environ.get("ESTIMATOR_ACCUM_TEST_FORK") != "0"):
  _load("fork_start").install()
