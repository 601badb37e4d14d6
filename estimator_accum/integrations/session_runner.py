"""Deprecated: the session runner moved to `estimator_accum.estimator.runner`;
its public form is `estimator_accum.Estimator` (with `RunConfig`,
`EstimatorSpec`, `ModeKeys`), which takes tf.estimator's arguments.

Kept through the 0.2 releases: each name read here warns and is the new
module's.
"""

from clusterspec import deprecation

__getattr__ = deprecation.forwarding(
    "estimator_accum.integrations.session_runner",
    "estimator_accum.estimator.runner", " (or estimator_accum.Estimator)")
