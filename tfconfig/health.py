"""Deprecated: `tfconfig.health` moved to `estimator_accum.distribution.health`
(the watchdog a training task runs is the library's; the short names are
`estimator_accum.watch_cluster` and `estimator_accum.coordination_heartbeat`).

Kept so that a script written against the old name runs; each name read
here warns (DeprecationWarning) and is the new module's. Kept through the
0.2 releases, removed in 0.3.0 (CHANGELOG.md, "Deprecated").
"""

import importlib
import warnings

NEW_HOME = "estimator_accum.distribution.health"


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  warnings.warn(
      f"tfconfig.health.{name} moved: use {NEW_HOME}.{name} (or "
      f"estimator_accum.watch_cluster for watch); tfconfig.health goes in "
      f"the next release.", DeprecationWarning, stacklevel=2)
  # Read when a script asks, never when the launcher is imported: the
  # launcher itself imports nothing of the library (docs/design.md).
  return getattr(importlib.import_module(NEW_HOME), name)
