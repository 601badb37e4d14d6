"""A module's names moved elsewhere, kept for a release: the old module's
`__getattr__` warns (DeprecationWarning, pointing at the caller's line)
and hands over the new home's name. Pure Python, for the launcher and the
library alike."""

import importlib
import warnings


def forwarding(old, new_home, hint=""):
  """A module `__getattr__` for `old` whose names live in `new_home` (a
  module name, imported on first use); `hint` adds the public name to
  use."""

  def __getattr__(name):  # noqa: N807
    if name.startswith("__"):
      raise AttributeError(name)
    warnings.warn(
        f"{old}.{name} moved: use {new_home}.{name}{hint}; {old} goes in "
        f"the next release.", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(new_home), name)

  return __getattr__
