"""Ports for a cluster on this machine: `free_ports`, drawn outside the
kernel's ephemeral range, and `local_cluster`, a TF_CONFIG on free loopback
ports."""

import random
import socket

from clusterspec import config as tfc

__all__ = ["free_ports", "local_cluster"]

_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_UNPRIVILEGED = 1024


def _ephemeral_range():
  """(first, last) of the kernel's ephemeral ports, or None if unknown."""
  try:
    with open(_EPHEMERAL_RANGE) as file:
      first, last = (int(v) for v in file.read().split())
  except (OSError, ValueError):
    return None
  return first, last


def free_ports(count, host="127.0.0.1"):
  """Returns `count` distinct ports that were free on `host` just now,
  chosen at random outside the kernel's ephemeral range.

  A port is free here only until a task's server binds it, seconds later.
  A port the kernel gave (bind to port 0) is an ephemeral one, which every
  outgoing connection on the machine may take as its own local port in
  between (the gRPC connections of another job, a health probe): the task
  then fails with TensorFlow's "Could not start gRPC server". Outside that
  range only another program binding that very port can take it. Where
  the range leaves nothing outside it (or 64 tries a port found each
  taken), the kernel's ports are used.

  Raises:
    tfc.TFConfigError: the machine cannot give that many ports (open files
      or ports exhausted), in one line.
  """
  span = _ephemeral_range()
  outside = [] if span is None else [
      (low, high) for low, high in ((_UNPRIVILEGED, span[0] - 1),
                                    (span[1] + 1, 65535)) if low <= high]
  choices = sum(high - low + 1 for low, high in outside)
  # The OS's randomness: two launches whose `random` was seeded alike
  # (pytest-randomly seeds every test the same) must not draw alike.
  rng = random.SystemRandom()
  tries = 64 * count
  sockets, ports = [], []
  try:
    while len(ports) < count:
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sockets.append(sock)
      if choices and tries:
        tries -= 1
        port = _nth_port(outside, rng.randrange(choices))
        try:
          sock.bind((host, port))
        except OSError:
          # In use (one drawn before included: its socket is still bound).
          sockets.pop().close()
          continue
      else:
        sock.bind((host, 0))
      ports.append(sock.getsockname()[1])
  except OSError as error:
    raise tfc.TFConfigError(
        f"cannot reserve {count} free ports on {host}: "
        f"{error.strerror or error}") from None
  finally:
    for sock in sockets:
      sock.close()
  return ports


def _nth_port(ranges, n):
  """The `n`th port of `ranges` ((low, high) pairs, both included)."""
  for low, high in ranges:
    if n <= high - low:
      return low + n
    n -= high - low + 1
  raise IndexError(n)


def local_cluster(workers, chief=False, ps=0, evaluator=False):
  """A TF_CONFIG dict (no task) for a cluster on free loopback ports."""
  count = workers + int(chief) + ps + int(evaluator)
  addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
  take = lambda n: [addresses.pop(0) for _ in range(n)]  # noqa: E731
  return tfc.build(
      workers=take(workers), chief=take(1)[0] if chief else None,
      ps=take(ps), evaluator=take(1)[0] if evaluator else None)
