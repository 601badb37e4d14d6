"""Deprecated: the session runner moved to `estimator_accum.estimator.runner`;
its public form is `estimator_accum.Estimator` (with `RunConfig`,
`EstimatorSpec`, `ModeKeys`), which takes tf.estimator's arguments.

Kept so that code written against the old name runs; each name read here
warns (DeprecationWarning) and is the new module's.
"""

import warnings

from estimator_accum.estimator import runner as _new

NEW_HOME = "estimator_accum.estimator.runner"


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  warnings.warn(
      f"estimator_accum.integrations.session_runner.{name} moved: use "
      f"estimator_accum.Estimator (or {NEW_HOME}.{name}); the old name goes "
      f"in the next release.", DeprecationWarning, stacklevel=2)
  return getattr(_new, name)
