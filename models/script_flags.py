"""A script's flags read once, into one value passed down.

`FlagValues.of(flags.FLAGS)` copies every flag's value when the script
starts; the code below `main` reads that value, never `FLAGS`, and cannot
change it (a derived value, such as a default output directory, is its own
name).
"""

import types


class FlagValues:
  """Read-only flag values by attribute (`values.learning_rate`), and
  `given`: the names of the flags given on the command line."""

  def __init__(self, values, given):
    object.__setattr__(self, "_values", types.MappingProxyType(dict(values)))
    object.__setattr__(self, "given", frozenset(given))

  @classmethod
  def of(cls, flag_values):
    """The values of absl `flag_values` (parsed), and which were given."""
    return cls(flag_values.flag_values_dict(),
               [name for name in flag_values if flag_values[name].present])

  def __getattr__(self, name):
    try:
      return self._values[name]
    except KeyError:
      raise AttributeError(f"no flag --{name}") from None

  def __setattr__(self, name, value):
    raise AttributeError(f"flag values are read-only (--{name})")
