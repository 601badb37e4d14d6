"""Peak resident memory of this process over a stretch of work (Linux).

  with PeakMemory() as peak:
    ...train...
  peak.mb   # the high-water mark during the block, above the memory before
"""


def status_mb(field):
  """A memory field of /proc/self/status (VmRSS, VmHWM), in MB."""
  with open("/proc/self/status") as reader:
    for line in reader:
      if line.startswith(field + ":"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"/proc/self/status has no {field}")


class PeakMemory:
  """Resets the high-water mark on entry; `mb` is the peak above the
  resident memory at entry."""

  def __init__(self):
    self.mb = None
    self._before = None

  def __enter__(self):
    self._before = status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as writer:
      writer.write("5")  # Resets VmHWM, the peak resident memory.
    return self

  def __exit__(self, *unused):
    self.mb = status_mb("VmHWM") - self._before
    return False
