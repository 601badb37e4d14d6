"""Deprecated: `tfconfig.config` moved to `clusterspec.config` (TF_CONFIG's
format, shared by the launcher and the library).

Kept so that a script written against the old name runs; each name read
here warns (DeprecationWarning) and is the new module's. Kept through the
0.2 releases, removed in 0.3.0 (CHANGELOG.md, "Deprecated").
"""

import warnings

from clusterspec import config as _new

NEW_HOME = "clusterspec.config"


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  warnings.warn(
      f"tfconfig.config.{name} moved: use {NEW_HOME}.{name}; tfconfig.config "
      f"goes in the next release.", DeprecationWarning, stacklevel=2)
  return getattr(_new, name)
