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


# Environment for a child process whose peak memory is measured. glibc
# serves a large block from its heap once the block's size has been freed
# before (its mmap threshold rises up to 32 MB) and keeps freed heap memory,
# so the peak RSS of the same run moved by about 100 MB with the order of
# frees. With the threshold fixed, every tensor above 64 KB is its own
# mapping, returned to the system when freed: the peak is what was live at
# once, and repeats to a few MB.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
