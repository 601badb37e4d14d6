"""Deprecated: `tfconfig.health` moved to `estimator_accum.distribution.health`
(the watchdog a training task runs is the library's; the short names are
`estimator_accum.watch_cluster` and `estimator_accum.coordination_heartbeat`).

Kept through the 0.2 releases, removed in 0.3.0 (CHANGELOG.md,
"Deprecated"): each name read here warns and is the new module's, which is
imported only then (the launcher itself imports nothing of the library).
"""

from clusterspec import deprecation

__getattr__ = deprecation.forwarding(
    "tfconfig.health", "estimator_accum.distribution.health",
    " (or estimator_accum.watch_cluster for watch)")
