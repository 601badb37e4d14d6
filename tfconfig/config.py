"""Deprecated: `tfconfig.config` moved to `clusterspec.config` (TF_CONFIG's
format, shared by the launcher and the library).

Kept through the 0.2 releases, removed in 0.3.0 (CHANGELOG.md,
"Deprecated"): each name read here warns and is the new module's.
"""

from clusterspec import deprecation

__getattr__ = deprecation.forwarding("tfconfig.config", "clusterspec.config")
