"""Whether processes still run, for tests that stop them."""

import time


def alive(pid):
  """Whether `pid` runs (a zombie counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def wait_gone(pids, seconds):
  """The pids of `pids` still running after up to `seconds`."""
  deadline = time.monotonic() + seconds
  while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  return [pid for pid in pids if alive(pid)]
