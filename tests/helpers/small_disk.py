"""A size-limited disk for the full-disk tests: a tmpfs mounted for the
test (root only; CI is root), and filling it for real."""

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def mounted(path, size="32m"):
  """A tmpfs of `size` mounted at `path` (made), unmounted after; skips the
  test where mounting needs root and this is not."""
  if os.geteuid() != 0:
    pytest.skip("mounts a size-limited tmpfs, which needs root (CI is root)")
  path.mkdir()
  subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                  str(path)], check=True)
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path):
  """Writes the file `path` until the disk has no room left."""
  with open(path, "wb") as file:
    try:
      while True:
        file.write(b"\0" * 65536)
        file.flush()
    except OSError:
      pass
