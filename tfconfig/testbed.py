"""Hosts on one machine: a network namespace per task, joined by a switch.

```python
with TestBed(hosts=3, rate="1gbit") as bed:      # root only (Linux)
  cluster = bed.cluster(workers=2, ps=0, chief=True)   # 10.213.N.1:2222 ...
  command = bed.exec_prefix(0) + ["python", "train.py"]
  bed.cut(1); bed.restore(1)                      # the link of host 1
  bed.set_loss(1, 5)                              # 5% of its input dropped
```

Each host `<name>h<i>` has one interface, `eth0`, with the addresses
10.213.N.(i+1)/24 and fd13:0:0:N::(i+1)/64 on a veth link to a bridge in
the namespace `<name>sw`.
The subnet exists only on those links: no host has a default route, so
nothing a task sends leaves the test bed, and TensorFlow's servers, which
listen on every interface of their own namespace, are reachable from the
test bed's hosts only. Optional shaping: `tc ... tbf` at `rate` on both
ends of every link (this kernel has `tbf`, not `netem`); random loss: an
nftables rule on a host's input hook (`numgen random mod 100 < P drop`).

Everything is removed on exit, whatever happened (deleting a namespace
deletes its links); `remove_leftovers(prefix)` removes what a killed run
left behind, by name.
"""

import ipaddress
import os
import re
import shutil
import subprocess
import zlib

PREFIX = "eatb"
PORT = 2222
_SUBNET = "10.213.{net}.0/24"
_SUBNET6 = "fd13:0:0:{net}::/64"


class TestBedError(RuntimeError):
  """The test bed cannot be made here; the message is one line."""


def _run(*command, input_text=None, check=True):
  result = subprocess.run(command, input=input_text, capture_output=True,
                          text=True)
  if check and result.returncode != 0:
    raise TestBedError(f"{' '.join(command)}: {result.stderr.strip()}")
  return result


def available():
  """None when a test bed can be made here, else why not (one line)."""
  if os.geteuid() != 0:
    return "network namespaces need root"
  for tool in ("ip", "tc"):
    if shutil.which(tool) is None:
      return f"{tool!r} (iproute2) is not installed"
  return None


def namespaces(prefix=PREFIX):
  """Names of the network namespaces that start with `prefix`."""
  result = _run("ip", "netns", "list", check=False)
  return [line.split()[0] for line in result.stdout.splitlines()
          if line.strip() and line.split()[0].startswith(prefix)]


def remove_leftovers(prefix=PREFIX, only_dead=False):
  """Deletes every namespace named `prefix...`; returns their names.

  With `only_dead`, only those of test beds whose process is gone (the
  default names carry the making process's id: `eatb<pid>...`), so that a
  run can clean up after a killed one while another run is still using
  its own.
  """
  removed = []
  for name in namespaces(prefix):
    if only_dead:
      match = re.match(re.escape(PREFIX) + r"(\d+)", name)
      if not match or os.path.exists(f"/proc/{match.group(1)}"):
        continue
    _run("ip", "netns", "del", name, check=False)
    removed.append(name)
  return removed


class TestBed:
  """`hosts` network namespaces on a private subnet; a context manager.

  Args:
    hosts: int >= 1, one per task.
    name: str, the namespaces' prefix (default: `eatb` and this process's
      id, so that parallel test runs do not meet).
    rate: optional tc rate ("1gbit", "10gbit") shaping every link both ways.
  """

  def __init__(self, hosts, name=None, rate=None):
    if not isinstance(hosts, int) or not 1 <= hosts <= 250:
      raise ValueError(f"hosts must be an int in 1..250, got {hosts!r}")
    self.name = name or f"{PREFIX}{os.getpid()}"
    self.hosts = hosts
    self.rate = rate
    # One /24 per name, so that two test beds never share addresses.
    net = zlib.crc32(self.name.encode()) % 250 + 1
    self.network = ipaddress.ip_network(_SUBNET.format(net=net))
    self.network6 = ipaddress.ip_network(_SUBNET6.format(net=net))
    self.switch = f"{self.name}sw"

  def host(self, index):
    return f"{self.name}h{index}"

  def address(self, index):
    """The host's IPv4 address, a str."""
    return str(self.network.network_address + index + 1)

  def address6(self, index):
    """The host's IPv6 address, a str."""
    return str(self.network6.network_address + index + 1)

  def exec_prefix(self, index):
    """The command prefix that runs a program on host `index`."""
    return ["ip", "netns", "exec", self.host(index)]

  def cluster(self, workers, chief=False, ps=0, evaluator=False):
    """A TF_CONFIG dict (no task), one task per host, port 2222 on each,
    hosts given in `tfconfig.tasks` order (chief, workers, ps, evaluator).
    """
    from clusterspec import config as tfc

    count = workers + int(chief) + ps + int(evaluator)
    if count > self.hosts:
      raise ValueError(f"{count} tasks need {count} hosts; the test bed has "
                       f"{self.hosts}")
    addresses = [f"{self.address(i)}:{PORT}" for i in range(count)]
    take = lambda n: [addresses.pop(0) for _ in range(n)]  # noqa: E731
    chief_address = take(1)[0] if chief else None
    return tfc.build(workers=take(workers), chief=chief_address, ps=take(ps),
                     evaluator=take(1)[0] if evaluator else None)

  def up(self):
    reason = available()
    if reason:
      raise TestBedError(f"cannot make a test bed: {reason}")
    try:
      self._make()
    except BaseException:
      self.down()
      raise
    return self

  def _make(self):
    _run("ip", "netns", "add", self.switch)
    _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
    _run("ip", "-n", self.switch, "link", "set", "br0", "up")
    prefix = self.network.prefixlen
    for index in range(self.hosts):
      host = self.host(index)
      _run("ip", "netns", "add", host)
      _run("ip", "-n", host, "link", "set", "lo", "up")
      _run("ip", "-n", self.switch, "link", "add", f"p{index}", "type",
           "veth", "peer", "name", "eth0", "netns", host)
      _run("ip", "-n", self.switch, "link", "set", f"p{index}", "master",
           "br0")
      _run("ip", "-n", self.switch, "link", "set", f"p{index}", "up")
      _run("ip", "-n", host, "addr", "add",
           f"{self.address(index)}/{prefix}", "dev", "eth0")
      _run("ip", "-n", host, "-6", "addr", "add",
           f"{self.address6(index)}/{self.network6.prefixlen}", "dev",
           "eth0", "nodad")
      _run("ip", "-n", host, "link", "set", "eth0", "up")
      if self.rate:
        self.shape(index, self.rate)

  def down(self):
    """Removes every namespace of this test bed (idempotent)."""
    remove_leftovers(self.name)

  def __enter__(self):
    return self.up()

  def __exit__(self, *exc_info):
    self.down()

  def shape(self, index, rate):
    """Limits host `index`'s link to `rate` both ways (tc tbf)."""
    for namespace, device in ((self.host(index), "eth0"),
                              (self.switch, f"p{index}")):
      _run("ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev",
           device, "root", "tbf", "rate", rate, "burst", "256kb", "latency",
           "100ms")

  def cut(self, index):
    """Cuts host `index`'s link at the switch (its interface stays up)."""
    _run("ip", "-n", self.switch, "link", "set", f"p{index}", "down")

  def restore(self, index):
    _run("ip", "-n", self.switch, "link", "set", f"p{index}", "up")

  def set_loss(self, index, percent):
    """Drops `percent`% of the packets host `index` receives, at random."""
    if shutil.which("nft") is None:
      raise TestBedError("random loss needs nftables ('nft'); apt-get "
                         "install nftables")
    if not 0 <= percent <= 100:
      raise ValueError(f"percent must be in 0..100, got {percent!r}")
    rules = ("table inet loss {\n  chain input {\n    type filter hook input "
             "priority 0; policy accept;\n    iifname \"eth0\" numgen random "
             f"mod 100 < {int(percent)} drop\n  }}\n}}\n")
    _run("ip", "netns", "exec", self.host(index), "nft", "-f", "-",
         input_text=rules)

  def clear_loss(self, index):
    _run("ip", "netns", "exec", self.host(index), "nft", "delete", "table",
         "inet", "loss", check=False)
