"""Loaded by every Python process of a test session (tests/conftest.py puts
this folder on PYTHONPATH): starts its Python children through the
session's fork servers (tests/helpers/fork_start.py). Loads that module by
its path, adding nothing to sys.path."""

import importlib.util
import os
import sys

if os.environ.get("ESTIMATOR_ACCUM_TEST_FORK_DIR") and (
    os.environ.get("ESTIMATOR_ACCUM_TEST_FORK") != "0"):
  _PATH = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "fork_start.py")
  _SPEC = importlib.util.spec_from_file_location(
      "_estimator_accum_test_fork_start", _PATH)
  _MODULE = importlib.util.module_from_spec(_SPEC)
  sys.modules[_SPEC.name] = _MODULE
  _SPEC.loader.exec_module(_MODULE)
  _MODULE.install()
