"""Closing a job's TensorFlow ports to everyone but the job's own tasks.

TensorFlow's gRPC server listens on every address of its host, IPv4 and
IPv6 (`[::]:<port>`), with no authentication: whoever reaches a task's port
runs graph operations in that task, as the job's user (read and write its
files, start processes). Nothing in TensorFlow changes that, so the ports
are closed around it:

- **firewall** (root or CAP_NET_ADMIN, and nftables' library): an nftables
  `inet` table (both families) admits to the job's ports only the job's own
  hosts' addresses (on one host: loopback) and, on this host, only the
  job's own user. The table is made with nftables' `owner` flag by a small
  holder process that lives exactly as long as its owner (the launcher, or
  the task it guards): the kernel removes the table when the holder ends,
  however it ends, SIGKILL included. Outbound traffic is untouched.
- **namespace** (one host only): every task runs in one private network
  namespace with only loopback up, made by a holder process (an
  unprivileged user namespace where the process is not root). Nothing
  outside it can reach the ports; the tasks keep the file system, devices
  and their user, but have no network beyond loopback (a remote model_dir,
  `gs://` or `s3://`, is out of reach there: run as root for the firewall).
  The namespace goes away with its last process.
- **open**: TensorFlow's default. Only on request.

`one_host(ports, mode)` closes a one-host launch's ports (tfconfig launch);
`guard_task(tf_config, mode)` closes one task's port in a multi-host job to
every address but its peers' (tfconfig guard, tfconfig slurm).
"""

import ctypes
import ctypes.util
import ipaddress
import os
import select
import signal
import socket
import subprocess
import sys

MODES = ("auto", "firewall", "namespace", "open")
HOST_MODES = ("auto", "firewall", "open")
TABLE_PREFIX = "estimator_accum_"
OPEN_FLAG = "--isolation open"
# Set in a task's environment by what closed (or opened, on request) its
# port: `estimator_accum` then leaves the port alone on import
# (estimator_accum/distribution/ports.py).
CLOSED_BY_ENV = "ESTIMATOR_ACCUM_PORTS"

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_READY = "ready"
# How long a holder may take to make its table or namespace.
_HOLDER_SECONDS = 30


class ClosingError(RuntimeError):
  """The ports cannot be closed as asked; the message is one line."""


def _capability(bit):
  """Whether this process holds capability `bit` (Linux; else False)."""
  try:
    with open("/proc/self/status", encoding="ascii") as status:
      for line in status:
        if line.startswith("CapEff:"):
          return bool(int(line.split()[1], 16) >> bit & 1)
  except OSError:
    pass
  return False


def _nftables_library():
  """libnftables, or None."""
  for name in ("libnftables.so.1", ctypes.util.find_library("nftables")):
    if not name:
      continue
    try:
      return ctypes.CDLL(name)
    except OSError:
      continue
  return None


def firewall_unavailable():
  """None when this process may write nftables tables, else why not."""
  if not sys.platform.startswith("linux"):
    return "nftables is Linux only"
  if not _capability(_CAP_NET_ADMIN):
    return "not root and no CAP_NET_ADMIN"
  if _nftables_library() is None:
    return "nftables' library (libnftables.so.1, package nftables) is not installed"
  return None


def _uid():
  return os.geteuid()


def _elements(values):
  return ", ".join(str(value) for value in values)


def _ports(ports):
  ports = sorted(ports)
  return f"port{'s' if len(ports) > 1 else ''} {_elements(ports)}"


# A connection opens with a SYN from its client's socket: checking the
# client's user on that packet alone is enough, and every other packet
# leaves the output chain at its first comparison (the job's all-reduces
# cross it on every window). The input chain lets loopback through first,
# for the same reason.
_OPENING = "tcp flags & (syn | ack) == syn"


def one_host_rules(table, ports, uid=None):
  """nftables text: `ports` closed to every other host (both families)
  and to every other local user than `uid`."""
  uid = _uid() if uid is None else uid
  ports = sorted(set(int(port) for port in ports))
  return (
      f"table inet {table} {{\n"
      f"  set ports {{ type inet_service; elements = {{ {_elements(ports)} }}; }}\n"
      "  chain input {\n"
      "    type filter hook input priority -10; policy accept;\n"
      '    iif "lo" accept;\n'
      "    tcp dport @ports counter drop;\n"
      "  }\n"
      "  chain output {\n"
      "    type filter hook output priority -10; policy accept;\n"
      f"    {_OPENING} tcp dport @ports meta skuid != {uid} counter reject "
      "with tcp reset;\n"
      "  }\n"
      "}\n")


def peer_rules(table, port, peers, cluster_ports, uid=None):
  """nftables text for one task of a multi-host job: its `port` admits
  only the `peers` addresses (and this host, for the job's user), and no
  other local user reaches any of the cluster's ports on its peers."""
  uid = _uid() if uid is None else uid
  v4 = sorted({str(a) for a in peers if a.version == 4},
              key=ipaddress.ip_address)
  v6 = sorted({str(a) for a in peers if a.version == 6},
              key=ipaddress.ip_address)
  ports = sorted(set(int(p) for p in cluster_ports) | {int(port)})
  lines = [f"table inet {table} {{",
           f"  set ports {{ type inet_service; elements = {{ {_elements(ports)} }}; }}"]
  if v4:
    lines.append(f"  set peers4 {{ type ipv4_addr; elements = {{ {_elements(v4)} }}; }}")
  if v6:
    lines.append(f"  set peers6 {{ type ipv6_addr; elements = {{ {_elements(v6)} }}; }}")
  lines += ["  chain input {",
            "    type filter hook input priority -10; policy accept;",
            f'    tcp dport {port} iif "lo" accept;']
  if v4:
    lines.append(f"    tcp dport {port} ip saddr @peers4 accept;")
  if v6:
    lines.append(f"    tcp dport {port} ip6 saddr @peers6 accept;")
  lines += [f"    tcp dport {port} counter drop;",
            "  }",
            "  chain output {",
            "    type filter hook output priority -10; policy accept;",
            f"    {_OPENING} tcp dport {port} fib daddr type local "
            f"meta skuid != {uid} counter reject with tcp reset;"]
  if v4:
    lines.append(f"    {_OPENING} ip daddr @peers4 tcp dport @ports "
                 f"meta skuid != {uid} counter reject with tcp reset;")
  if v6:
    lines.append(f"    {_OPENING} ip6 daddr @peers6 tcp dport @ports "
                 f"meta skuid != {uid} counter reject with tcp reset;")
  lines += ["  }", "}", ""]
  return "\n".join(lines)


def _owned(rules):
  """The same table with nftables' owner flag: the kernel deletes it when
  the process that made it ends."""
  head, rest = rules.split("\n", 1)
  return f"{head}\n  flags owner;\n{rest}"


def _table_name(tag):
  return f"{TABLE_PREFIX}{os.getpid()}_{tag}"


# --- holders ---------------------------------------------------------------

class Closure:
  """A job's ports, closed for as long as this object is open: the holder
  process, and how tasks are started inside (`preexec`)."""

  def __init__(self, mode, holder=None, table=None, namespace_pid=None,
                 user_namespace=False, description=""):
    self.mode = mode
    self.table = table
    self.description = description
    self._holder = holder
    self._namespace_pid = namespace_pid
    self._user_namespace = user_namespace

  def preexec(self):
    """Run in a task's child process before exec: joins the namespace."""
    if self._namespace_pid is None:
      return
    libc = ctypes.CDLL(None, use_errno=True)
    kinds = (("user", _CLONE_NEWUSER),) if self._user_namespace else ()
    for kind, flag in kinds + (("net", _CLONE_NEWNET),):
      fd = os.open(f"/proc/{self._namespace_pid}/ns/{kind}", os.O_RDONLY)
      try:
        if libc.setns(fd, flag) != 0:
          error = ctypes.get_errno()
          raise OSError(error, f"setns({kind}): {os.strerror(error)}")
      finally:
        os.close(fd)

  def keep_across_exec(self):
    """For a process that is about to exec its task: the holder's stdin
    stays open in the task, so the holder lives exactly as long as it."""
    if self._holder is not None:
      os.set_inheritable(self._holder.stdin.fileno(), True)

  def close(self):
    """Ends the holder: the table or the namespace (once its tasks have
    ended) goes with it."""
    holder, self._holder = self._holder, None
    if holder is None:
      return
    try:
      holder.stdin.close()
    except OSError:
      pass
    try:
      holder.wait(timeout=5)
    except subprocess.TimeoutExpired:
      holder.kill()
      holder.wait()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()


def _holder_preexec():
  """The holder dies with the process that started it (the kernel's
  parent-death signal), and ignores the stop signals sent to the job's
  terminal or process group: the ports stay closed until the tasks end."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)


def _start_holder(kind, payload=""):
  """Starts `python -m clusterspec.closing_holder KIND`; returns the process
  once it said it is ready, or raises ClosingError with its line."""
  process = subprocess.Popen(
      [sys.executable, "-m", "clusterspec.closing_holder", kind,
       str(os.getpid())],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, start_new_session=True, preexec_fn=_holder_preexec,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join(
          [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] +
          [p for p in [os.environ.get("PYTHONPATH")] if p])))
  process.stdin.write(payload)
  process.stdin.write("\n\0\n")
  process.stdin.flush()
  ready, _, _ = select.select([process.stdout], [], [], _HOLDER_SECONDS)
  line = process.stdout.readline().strip() if ready else ""
  if line != _READY:
    process.kill()
    rest = process.stdout.read().strip() if ready else ""
    process.wait()
    reason = (line + (" " + rest if rest else "")).strip() or (
        f"no answer within {_HOLDER_SECONDS} s")
    raise ClosingError(reason.replace("\n", "; "))
  return process


def firewall(rules, table):
  """A Closure holding the nftables `rules` (their table `table`)."""
  holder = _start_holder("table", _owned(rules))
  return Closure("firewall", holder=holder, table=table)


def namespace():
  """A Closure holding a private network namespace with loopback up."""
  user = os.geteuid() != 0 or not _capability(_CAP_SYS_ADMIN)
  holder = _start_holder("user-namespace" if user else "namespace")
  return Closure("namespace", holder=holder, namespace_pid=holder.pid,
                 user_namespace=user)


def one_host(ports, mode="auto"):
  """Closes a one-host job's `ports` (every task on this host, on
  loopback) as `mode` says; returns a Closure (mode 'open': holds nothing).

  auto: the firewall where this process may write one, else a private
  network namespace, else ClosingError naming both reasons and the flag
  that opens the ports.
  """
  if mode not in MODES:
    raise ClosingError(f"--isolation {mode!r} is not one of {', '.join(MODES)}")
  if mode == "open":
    return Closure("open", description=(
        f"{_ports(ports)} {'are' if len(set(ports)) > 1 else 'is'} open to "
        f"every host and local user ({OPEN_FLAG})"))
  reasons = []
  if mode in ("auto", "firewall"):
    reason = firewall_unavailable()
    if reason is None:
      table = _table_name("launch")
      try:
        closure = firewall(one_host_rules(table, ports), table)
        closure.description = (
            f"{_ports(ports)} closed to other hosts (IPv4 and "
            f"IPv6) and other local users: nftables table inet {table}")
        return closure
      except ClosingError as error:
        reason = str(error)
    reasons.append(f"no firewall ({reason})")
  if mode in ("auto", "namespace"):
    try:
      closure = namespace()
      closure.description = (
          "tasks in a private network namespace (loopback only; no other "
          "host or local user reaches their ports, and they have no "
          "network beyond loopback)")
      return closure
    except ClosingError as error:
      reasons.append(f"no private network namespace ({error})")
  raise ClosingError(
      "cannot close the job's ports to other hosts and users here: "
      + "; ".join(reasons) + f"; {OPEN_FLAG} runs the job with its ports "
      "open to every host and local user")


# --- a task of a multi-host job ---------------------------------------------

def _split_address(address):
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def resolve_peers(cluster):
  """Every address (both families) of every host in `cluster` (a
  TF_CONFIG 'cluster' dict), and every port in it."""
  peers, ports, unresolved = set(), set(), []
  for addresses in cluster.values():
    for address in addresses:
      host, port = _split_address(address)
      ports.add(port)
      try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
      except socket.gaierror:
        unresolved.append(host)
        continue
      for info in infos:
        peers.add(ipaddress.ip_address(info[4][0].split("%")[0]))
  return peers, ports, unresolved


def _task_address(tf_config):
  task = tf_config.get("task") or {}
  kind, index = task.get("type"), int(task.get("index", 0))
  addresses = (tf_config.get("cluster") or {}).get(kind) or []
  if index >= len(addresses):
    raise ClosingError(
        f"TF_CONFIG names task {kind}:{index}, which its cluster does not list")
  return f"{kind}:{index}", addresses[index]


def guard_task(tf_config, mode="auto", log=None, prefix="[tfconfig]",
               open_flag=OPEN_FLAG):
  """Closes this task's port (from `tf_config`, TF_CONFIG as a dict) to
  every address but its cluster's hosts', and to every local user but
  this one. Returns a Closure.

  Where this process may not write a firewall (not root), mode 'auto'
  goes on with the port open and writes one line on `log` (after
  `prefix`) naming the port and the commands that close it; mode
  'firewall' raises. Mode 'open' holds nothing; its description names
  `open_flag`, what asked for it.
  """
  log = log or sys.stderr
  if mode not in HOST_MODES:
    raise ClosingError(
        f"--isolation {mode!r} is not one of {', '.join(HOST_MODES)} (a "
        "task of a multi-host job needs the network: no namespace)")
  name, address = _task_address(tf_config)
  _, port = _split_address(address)
  if mode == "open":
    return Closure("open", description=(
        f"{name}: port {port} left open to every host and local user "
        f"({open_flag})"))
  peers, ports, unresolved = resolve_peers(tf_config.get("cluster") or {})
  if unresolved:
    reason = (f"cannot resolve {', '.join(sorted(set(unresolved)))} from "
              "TF_CONFIG, so its peers' addresses are unknown")
    if mode == "firewall":
      raise ClosingError(f"cannot close {name}'s port {port}: {reason}")
    log.write(f"{prefix} warning: {name}'s port {port} is OPEN to every "
              f"host and local user ({reason})\n")
    log.flush()
    return Closure("open")
  table = _table_name(f"task_{port}")
  rules = peer_rules(table, port, peers, ports)
  reason = firewall_unavailable()
  if reason is None:
    try:
      closure = firewall(rules, table)
      closure.description = (
          f"{name}: port {port} admits only the cluster's "
          f"{len(peers)} address(es) and this user (nftables table inet "
          f"{table})")
      return closure
    except ClosingError as error:
      reason = str(error)
  if mode == "firewall":
    raise ClosingError(f"cannot close {name}'s port {port}: {reason}")
  manual = f"{TABLE_PREFIX}port_{port}"
  flat = peer_rules(manual, port, peers, ports).replace("\n", " ")
  table = manual
  log.write(
      f"{prefix} warning: {name}'s port {port} is OPEN to every host and "
      f"local user ({reason}); to close it, as root: nft -f - <<< "
      f"'{flat.strip()}' (and nft delete table inet {table} after the "
      "job)\n")
  log.flush()
  return Closure("open")
