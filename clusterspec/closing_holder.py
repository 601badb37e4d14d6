"""The holder of a closed job's table or namespace (clusterspec/closing.py).

`python -m clusterspec.closing_holder table|namespace|user-namespace OWNER`
(OWNER: the process id of its owner, for `ps` and the tests) reads
its payload on stdin up to a line holding NUL (the nftables text, for
`table`), makes the table or the namespace, writes `ready` (or one line
saying why not) on stdout, then waits for stdin to end: its owner closed
it, or ended. Its owner starts it with the kernel's parent-death signal,
so it never outlives the owner.

- table: an nftables table with the `owner` flag, which the kernel deletes
  when this process ends, however it ends. On a kernel without that flag
  (before Linux 5.12) the table is made without it and deleted here when
  stdin ends; one left by a holder that was killed (its name carries its
  owner's process id) is deleted by the next holder.
- namespace: a network namespace (root); user-namespace: a user namespace
  mapping this user to itself, and a network namespace in it (any user,
  where the kernel allows unprivileged user namespaces). Loopback is up in
  it; the tasks join it through /proc/<this pid>/ns/. It ends with its
  last process.
"""

import ctypes
import fcntl
import os
import re
import socket
import struct
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_PREFIX = "estimator_accum_"


def _say(line):
  sys.stdout.write(line.replace("\n", "; ") + "\n")
  sys.stdout.flush()


class _Nft:
  def __init__(self):
    self.lib = ctypes.CDLL("libnftables.so.1")
    self.lib.nft_ctx_new.restype = ctypes.c_void_p
    self.lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    self.lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p,
                                                 ctypes.c_char_p]
    for name in ("nft_ctx_buffer_error", "nft_ctx_buffer_output"):
      getattr(self.lib, name).argtypes = [ctypes.c_void_p]
    for name in ("nft_ctx_get_error_buffer", "nft_ctx_get_output_buffer"):
      getattr(self.lib, name).argtypes = [ctypes.c_void_p]
      getattr(self.lib, name).restype = ctypes.c_char_p
    self.ctx = self.lib.nft_ctx_new(0)
    self.lib.nft_ctx_buffer_error(self.ctx)
    self.lib.nft_ctx_buffer_output(self.ctx)

  def run(self, text):
    """(ok, output or error text)."""
    code = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
    if code != 0:
      error = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode()
      return False, " ".join(error.split()) or f"nft failed ({code})"
    return True, (self.lib.nft_ctx_get_output_buffer(self.ctx) or b"").decode()


def _clear_stale(nft):
  """Deletes tables left by holders whose owner is gone (only on kernels
  without the owner flag do any remain)."""
  ok, listing = nft.run("list tables")
  if not ok:
    return
  for family, name in re.findall(r"table (\w+) (" + _PREFIX + r"\S+)", listing):
    match = re.match(_PREFIX + r"(\d+)_", name)
    if match and not os.path.exists(f"/proc/{match.group(1)}"):
      nft.run(f"delete table {family} {name}")


def _table(rules):
  nft = _Nft()
  _clear_stale(nft)
  ok, error = nft.run(rules)
  owned = True
  if not ok and "owner" in rules and ("flags" in error or "owner" in error):
    owned = False
    ok, error = nft.run(rules.replace("  flags owner;\n", "", 1))
  if not ok:
    _say(f"nftables refused the table: {error}")
    return 1
  name = re.match(r"table (\w+ \S+)", rules).group(1)
  _say("ready")
  sys.stdin.read()
  if not owned:
    nft.run(f"delete table {name}")
  return 0


def _write(path, text):
  # Bytes: once in a user namespace of its own, this process may no longer
  # reach the interpreter's modules (a codec looked up now would fail).
  with open(path, "wb") as stream:
    stream.write(text.encode())


def _loopback_up():
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    request = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS,
                                                  request))[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS,
                struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _namespace(user):
  libc = ctypes.CDLL(None, use_errno=True)
  uid, gid = os.geteuid(), os.getegid()
  flags = _CLONE_NEWNET | (_CLONE_NEWUSER if user else 0)
  if libc.unshare(flags) != 0:
    error = ctypes.get_errno()
    what = "user and network namespace" if user else "network namespace"
    hint = ""
    if user and error in (1, 28):  # EPERM, ENOSPC
      hint = (" (unprivileged user namespaces are off here: "
              "kernel.unprivileged_userns_clone, user.max_user_namespaces or "
              "an AppArmor/SELinux policy)")
    _say(f"cannot make a {what}: {os.strerror(error)}{hint}")
    return 1
  try:
    if user:
      _write("/proc/self/setgroups", "deny")
      _write("/proc/self/uid_map", f"{uid} {uid} 1")
      _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _loopback_up()
  except OSError as error:
    _say(f"cannot set up the namespace: {error}")
    return 1
  _say("ready")
  sys.stdin.read()
  return 0


def main(argv):
  kind = argv[1] if len(argv) > 1 else ""
  payload = []
  for line in sys.stdin:
    if line == "\0\n":
      break
    payload.append(line)
  try:
    if kind == "table":
      return _table("".join(payload).rstrip("\n") + "\n")
    if kind in ("namespace", "user-namespace"):
      return _namespace(kind == "user-namespace")
  except OSError as error:
    _say(f"{kind}: {error}")
    return 1
  _say(f"unknown holder kind {kind!r}")
  return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv))
