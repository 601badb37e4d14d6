"""The suite's Python children, forked from a process that has TensorFlow
imported (a fork server), instead of each importing it again.

Why: `import tensorflow` costs about 3 s of CPU per process (1.8 s of it
loading TensorFlow's shared libraries, which nothing in Python can make
shorter), and the suite starts some 450 Python processes that import it:
measured with every process's CPU time recorded at its exit, about 40% of
the whole suite's CPU on a 2-core machine. A child forked from a process
that has done the import starts in milliseconds, and is a real process all
the same: its own pid, process group, session, file descriptors,
environment and working directory, signals sent to it and its exit status
read as from any child.

How: `tests/conftest.py` sets ESTIMATOR_ACCUM_TEST_FORK_DIR for the session
and puts `tests/helpers/fork_site` (a `sitecustomize`) on PYTHONPATH, so that
every Python process of the test session, the launcher `python -m tfconfig
launch` a test starts included, has `subprocess.Popen` replaced by
`ForkedPopen`. It starts `python script.py ...`, `python -m module ...`
and `python -c CODE ...` through a fork server, one per interpreter-start
environment (the variables Python and TensorFlow read when they start:
PYTHONPATH, TF_CPP_MIN_LOG_LEVEL, TF_ENABLE_ONEDNN_OPTS, ...), started on
first use and stopped with the session. Anything else is started as
before (exec): a shell, another program, interpreter options, file
descriptors passed on, a preexec function (except the launcher's
die-with-parent, which the child keeps by watching its requester's pid), a
Slurm step (Slurm tracks its tasks' process tree), a requester in another
network namespace than the session's. `ip netns exec NAME python ...`
(tfconfig.testbed's hosts) is forked too: the child joins the namespace
itself.
ESTIMATOR_ACCUM_TEST_FORK=0 turns it off for a test, or for a run.

The product never uses this: the project's own launcher and scripts start
processes with exec, as users run them.
"""

import array
import gc
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import types

DIR_ENV = "ESTIMATOR_ACCUM_TEST_FORK_DIR"
SWITCH_ENV = "ESTIMATOR_ACCUM_TEST_FORK"
# A file each forked child's CPU seconds are appended to when it is reaped,
# with the test that started it and its argv (tab-separated): set for a
# run, it says where the suite's CPU goes, by process.
CPU_ENV = "ESTIMATOR_ACCUM_TEST_FORK_CPU"
# What the server imports before it forks: everything heavy the suite's
# children import, nothing of the project (its import-time behaviour, the
# SIGTERM handler, is each child's own).
PRELOAD = ("numpy", "tensorflow", "keras")
# Imported too where the release has it (TensorFlow 2.15 only).
PRELOAD_IF_PRESENT = ("tensorflow_estimator.python.estimator.estimator",)
# Variables read when Python or TensorFlow start: a child whose values
# differ gets a server of its own.
_START_PREFIXES = ("PYTHON", "TF_CPP_", "TF_ENABLE_", "TF_USE_", "LD_",
                   "MALLOC", "OMP_", "KMP_", "MKL", "OPENBLAS")
_START_NAMES = ("HOME", "KERAS_HOME", "CUDA_VISIBLE_DEVICES",
                "TF_CPU_ALLOCATOR_USE_BFC", "TMPDIR")
_NOT_AT_START = ("PYTHONUNBUFFERED",)  # set up per child, below
_ORIGINAL_POPEN = subprocess.Popen
_SERVER_SECONDS = 120.0


def _signature(env):
  """The interpreter-start part of `env`, and where the process lives."""
  start = _start_environment(env)
  start["<executable>"] = os.path.realpath(sys.executable)
  text = json.dumps(start, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _namespaces():
  try:
    return "/".join(str(os.stat(f"/proc/self/ns/{n}").st_ino)
                    for n in ("net", "mnt", "pid"))
  except OSError:
    return None


def _is_die_with_parent(function):
  return (getattr(function, "__name__", "") == "_die_with_parent" and
          getattr(function, "__module__", "") == "tfconfig.launch")


def _program(args, executable, shell, pass_fds, preexec_fn, others):
  """(kind, target, argv, netns) of a Python program a server can start,
  or None. `ip netns exec NAME python ...` (tfconfig.testbed's hosts) is
  one too: the child joins the namespace NAME itself (netns)."""
  netns = None
  if (len(args) > 4 and [os.fspath(a) for a in args[:3]] ==
      ["ip", "netns", "exec"] and executable is None):
    netns, args, executable = os.fspath(args[3]), args[4:], None
  if (shell or pass_fds or executable not in (None, args[0]) or
      (preexec_fn is not None and not _is_die_with_parent(preexec_fn)) or
      any(others) or len(args) < 2):
    return None
  try:
    if os.path.realpath(args[0]) != os.path.realpath(sys.executable):
      return None
  except (TypeError, ValueError):
    return None
  first = os.fspath(args[1])
  if first == "-m" and len(args) >= 3:
    return ("module", os.fspath(args[2]), [os.fspath(a) for a in args[2:]],
            netns)
  if first == "-c" and len(args) >= 3:
    # sys.argv as python gives it: '-c', then the arguments after the code.
    return ("code", os.fspath(args[2]),
            ["-c", *[os.fspath(a) for a in args[3:]]], netns)
  if first.startswith("-") or not first.endswith(".py"):
    return None
  return "path", first, [os.fspath(a) for a in args[1:]], netns


def _eligible(env):
  directory = os.environ.get(DIR_ENV)
  if not directory or not os.path.isdir(directory):
    return None
  if env.get(SWITCH_ENV, "1") == "0" or os.environ.get(SWITCH_ENV) == "0":
    return None
  if "SLURM_JOB_ID" in env or "SLURM_JOB_ID" in os.environ:
    return None  # Slurm signals and counts its step's process tree
  try:
    with open(os.path.join(directory, "namespaces")) as f:
      if f.read() != _namespaces():
        return None
  except OSError:
    return None
  return directory


class ForkedPopen(_ORIGINAL_POPEN):
  """subprocess.Popen, starting eligible Python children through a fork
  server (see the module's docstring)."""

  _fork_connection = None

  def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds,
                     cwd, env, startupinfo, creationflags, shell, p2cread,
                     p2cwrite, c2pread, c2pwrite, errread, errwrite,
                     restore_signals, gid, gids, uid, umask,
                     start_new_session, process_group):
    listed = (list(args) if not isinstance(args, (str, bytes, os.PathLike))
              else None)
    program = listed and _program(
        listed, executable, shell, pass_fds, preexec_fn,
        [gid, gids, uid, umask not in (-1, None),
         process_group not in (-1, None)])
    child_env = dict(os.environ if env is None else {
        os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
    directory = program and _eligible(child_env)
    if not directory:
      return super()._execute_child(
          args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
          startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
          c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
          umask, start_new_session, process_group)
    kind, target, argv, netns = program
    request = dict(
        kind=kind, target=target, argv=argv, env=child_env, netns=netns,
        cwd=os.path.abspath(os.fspath(cwd)) if cwd is not None
        else os.getcwd(),
        new_session=bool(start_new_session), pgid=os.getpgid(0),
        die_with=os.getpid() if preexec_fn is not None else None,
        requester=os.getpid())
    fds = [p2cread if p2cread != -1 else 0,
           c2pwrite if c2pwrite != -1 else 1,
           errwrite if errwrite != -1 else 2]
    connection = _connect(directory, _signature(child_env), child_env)
    try:
      _send(connection, request, fds)
    finally:
      # As Popen does once its child has them: only the child's ends stay.
      self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread,
                           errwrite)
    connection = _Channel(connection)
    reply = _read_line(connection, 60)
    if not reply.startswith("pid "):
      connection.close()
      raise OSError(f"fork server: {reply or 'no reply'}")
    self.pid = int(reply.split()[1])
    self._fork_connection = connection
    self._fork_status = None
    self._fork_done = threading.Event()
    threading.Thread(target=self._fork_read_status, daemon=True,
                     name=f"fork_start_wait_{self.pid}").start()
    self._child_created = True

  def _fork_read_status(self):
    """Waits for the server's report of the child's wait status."""
    line = _read_line(self._fork_connection, None)
    self._fork_connection.close()
    # The server gone without a report: as Popen takes ECHILD, status 0.
    self._fork_status = (int(line.split()[1]) if line.startswith("status ")
                         else 0)
    self._fork_done.set()

  def _internal_poll(self, _deadstate=None, **_):
    if self._fork_connection is None:
      return super()._internal_poll(_deadstate=_deadstate)
    if self.returncode is None and self._fork_done.is_set():
      self.returncode = os.waitstatus_to_exitcode(self._fork_status)
    return self.returncode

  def _wait(self, timeout):
    if self._fork_connection is None:
      return super()._wait(timeout)
    if self.returncode is None:
      if not self._fork_done.wait(timeout):
        raise subprocess.TimeoutExpired(self.args, timeout)
      self.returncode = os.waitstatus_to_exitcode(self._fork_status)
    return self.returncode


def install():
  """Replaces subprocess.Popen (and so subprocess.run) in this process,
  unless a copy of this module did (the server runs it as __main__)."""
  if subprocess.Popen.__name__ != "ForkedPopen":
    subprocess.Popen = ForkedPopen


# The client's side of the socket.

class _Channel:
  """A connection to a server, and what was read past its last line."""

  def __init__(self, connection):
    self.connection, self.buffered = connection, b""

  def fileno(self):
    return self.connection.fileno()

  def close(self):
    self.connection.close()


def _read_line(channel, timeout):
  """One line from the server ('' when it closed); '' by `timeout` too
  (None: no limit)."""
  deadline = None if timeout is None else time.monotonic() + timeout
  while b"\n" not in channel.buffered:
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([channel], [], [], left)
    if not ready:
      return ""
    chunk = channel.connection.recv(4096)
    if not chunk:
      return ""
    channel.buffered += chunk
  line, _, channel.buffered = channel.buffered.partition(b"\n")
  return line.decode()


def _send(connection, request, fds):
  data = json.dumps(request).encode() + b"\n"
  connection.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                               array.array("i", fds))])


def _connect(directory, signature, env):
  path = os.path.join(directory, f"{signature}.sock")
  for attempt in range(2):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      connection.connect(path)
      return connection
    except OSError:
      connection.close()
      if attempt:
        raise
    _start_server(directory, signature, env, path)
  raise AssertionError("unreachable")


def _start_server(directory, signature, env, path):
  import fcntl
  with open(os.path.join(directory, f"{signature}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):
      return
    log = open(os.path.join(directory, f"{signature}.log"), "ab")
    server_env = dict(env)
    server_env[SWITCH_ENV] = "1"
    process = _ORIGINAL_POPEN(
        [sys.executable, os.path.abspath(__file__), "serve", path],
        env=server_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True, cwd="/")
    deadline = time.monotonic() + _SERVER_SECONDS
    while not os.path.exists(path):
      if process.poll() is not None or time.monotonic() > deadline:
        raise OSError(f"fork server did not start (see "
                      f"{directory}/{signature}.log)")
      time.sleep(0.05)
    with open(os.path.join(directory, "servers"), "a") as servers:
      servers.write(f"{process.pid}\n")
    with open(os.path.join(directory, f"{signature}.start"), "w") as start:
      json.dump(_start_environment(env), start)


def _start_environment(env):
  """What of `env` a server's signature is made of, as a dict."""
  return {k: v for k, v in env.items()
          if (k.startswith(_START_PREFIXES) or k in _START_NAMES)
          and k not in _NOT_AT_START}


# The server.

def _convert_estimators_functions():
  """Autograph's conversions of Estimator's own functions that every child
  training under a distribution strategy makes (its model_fn call and its
  scaffold's ops run in the strategy's replica context, which converts
  them), made once here: each child finds them in autograph's cache (keyed
  by code object and options, the options a strategy's replica call uses)
  instead of converting them again (measured: 0.5 s of CPU in each worker
  of a two-worker job, a fifth of it after the imports). Only Estimator's
  functions: the converted code is the same, and the tests' own model
  functions are still converted in each child, as users' are."""
  # pylint: disable=import-outside-toplevel
  import types

  from tensorflow.python.autograph.core import converter
  from tensorflow.python.autograph.impl import api
  from tensorflow_estimator.python.estimator import estimator

  def functions_in(code):
    # The lambdas a function makes: functions of their own code objects
    # (autograph caches by code object), their free variables empty cells.
    for constant in code.co_consts:
      if isinstance(constant, types.CodeType):
        if constant.co_name == "<lambda>":
          yield types.FunctionType(
              constant, vars(estimator),
              closure=tuple(types.CellType() for _ in constant.co_freevars))
        yield from functions_in(constant)

  options = converter.ConversionOptions(
      recursive=True, user_requested=False, internal_convert_user_code=True,
      optional_features=frozenset())
  try:
    targets = [estimator.Estimator._call_model_fn,  # noqa: SLF001
               estimator.create_per_replica_ready_for_local_init_op,
               *functions_in(estimator._combine_distributed_scaffold  # noqa: SLF001
                             .__code__)]
  except AttributeError as error:  # another Estimator: children convert
    sys.stderr.write(f"[fork_start] nothing converted ahead: {error}\n")
    return
  for function in targets:
    try:
      api._convert_actual(  # noqa: SLF001
          function, converter.ProgramContext(options=options))
    except Exception as error:  # noqa: BLE001  a child converts it itself
      sys.stderr.write(f"[fork_start] not converted ahead: "
                       f"{function.__qualname__}: {error}\n")


def _serve(path):
  os.environ[DIR_ENV] = os.path.dirname(path)  # where _record writes
  for name in PRELOAD:
    __import__(name)
  try:
    for name in PRELOAD_IF_PRESENT:
      __import__(name)
  except ImportError:
    pass  # TensorFlow 2.16+: no Estimator to convert ahead
  else:
    _convert_estimators_functions()
  # What the imports made lives as long as the server, in every child too:
  # out of the garbage collector's sight, each child's first collections
  # stop walking it (measured: 5.2 s of 52.9 s of its children's CPU in
  # the collector on 6 two-worker jobs, 0.7 with it frozen), and their
  # pages stay shared with the server.
  gc.freeze()
  install()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path + ".new")
  listener.listen(64)
  os.rename(path + ".new", path)
  wake_read, wake_write = os.pipe()
  os.set_blocking(wake_write, False)
  signal.set_wakeup_fd(wake_write)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  children = {}  # pid -> the requester's connection
  while True:
    ready, _, _ = select.select([listener, wake_read], [], [], 5.0)
    if not os.path.exists(path):
      return  # the session ended without stopping this server
    if wake_read in ready:
      os.read(wake_read, 4096)
    _reap(children)
    if listener in ready:
      connection, _ = listener.accept()
      try:
        pid = _fork_one(connection, (listener, wake_read, wake_write))
      except OSError as error:
        _reply(connection, f"error {error}")
        connection.close()
        continue
      children[pid] = connection
      _reply(connection, f"pid {pid}")
    _reap(children)


def _reply(connection, line):
  try:
    connection.sendall(line.encode() + b"\n")
  except OSError:
    pass


def _reap(children):
  while children:
    try:
      pid, status, usage = os.wait4(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    connection = children.pop(pid, None)
    record = os.path.join(_children_directory(), f"{pid}.json")
    _note_cpu(record, usage)
    try:
      os.unlink(record)
    except OSError:
      pass
    if connection is not None:
      _reply(connection, f"status {status}")
      connection.close()


def _note_cpu(record, usage):
  """Appends the reaped child's CPU seconds (user + system, from wait4),
  the test that started it and its argv (a JSON list: one line whatever
  it holds) to the file its environment named in CPU_ENV, if it did:
  where the suite's CPU goes, by process."""
  try:
    with open(record) as f:
      child = json.load(f)
  except (OSError, ValueError):
    return
  if child.get("cpu_log"):
    try:
      with open(child["cpu_log"], "a") as log:
        log.write(f"{usage.ru_utime + usage.ru_stime:.2f}\t"
                  f"{child['test']}\t{json.dumps(child['argv'])}\n")
    except OSError as error:  # the server serves on; the child's line is lost
      sys.stderr.write(f"[fork_start] cannot note CPU: {error}\n")


def _fork_one(connection, server_fds):
  message, ancillary, _, _ = connection.recvmsg(
      1 << 20, socket.CMSG_SPACE(3 * array.array("i").itemsize))
  while not message.endswith(b"\n"):
    more = connection.recv(1 << 20)
    if not more:
      raise OSError("truncated request")
    message += more
  fds = array.array("i")
  for level, kind, data in ancillary:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
      fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
  request = json.loads(message)
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    try:
      connection.close()
      for fd in server_fds:
        os.close(fd if isinstance(fd, int) else fd.detach())
      _become(request, list(fds))
    except BaseException:  # noqa: BLE001 - said, then the exit below
      import traceback
      traceback.print_exc()
      sys.stderr.flush()
    finally:
      os._exit(127)
  for fd in fds:
    os.close(fd)
  _record(pid, request)
  return pid


def _children_directory():
  return os.path.join(os.environ[DIR_ENV], "children")


def _record(pid, request):
  """Notes who asked for child `pid`, its argv and TF_CONFIG: what a test
  finds a launcher's tasks by (harness/hosts.py reads these records: keep
  the two in step), which /proc shows of an exec'd child (its parent,
  cmdline and environ) but not of a forked one."""
  os.makedirs(_children_directory(), exist_ok=True)
  path = os.path.join(_children_directory(), f"{pid}.json")
  with open(path + ".new", "w") as record:
    json.dump({"pid": pid, "requester": request.get("requester"),
               "argv": request["argv"],
               "TF_CONFIG": request["env"].get("TF_CONFIG"),
               "test": request["env"].get("PYTEST_CURRENT_TEST", ""),
               "cpu_log": request["env"].get(CPU_ENV)}, record)
  os.rename(path + ".new", path)


def _become(request, fds):
  """In the forked child: becomes the requested program, and exits."""
  signal.set_wakeup_fd(-1)
  for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP,
                 signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                 signal.SIGALRM):
    signal.signal(number, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.pthread_sigmask(signal.SIG_SETMASK, [])
  if request["new_session"]:
    os.setsid()
  else:
    try:
      os.setpgid(0, request["pgid"])
    except OSError:  # another session's group: a group of its own
      os.setpgid(0, 0)
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf")
                else 65536)
  if request.get("netns"):
    _join_netns(request["netns"])
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  _new_stdio("PYTHONUNBUFFERED" in request["env"])
  if request["die_with"]:
    _die_with(request["die_with"])
  import random
  import tempfile
  tempfile.tempdir = None
  random.seed()
  if "numpy" in sys.modules:
    sys.modules["numpy"].random.seed()
  os._exit(_run(request))


def _join_netns(name):
  """What `ip netns exec NAME` does for a program's network: setns(2) into
  /run/netns/NAME (its remount of /sys and /etc/netns files aside, which
  TensorFlow's gRPC does not read). Failing, exits 255 as ip does."""
  import ctypes
  libc = ctypes.CDLL(None, use_errno=True)
  clone_newnet = 0x40000000
  try:
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
  except OSError as error:
    os.write(2, f"Cannot open network namespace \"{name}\": "
                f"{error.strerror}\n".encode())
    os._exit(255)
  if libc.setns(fd, clone_newnet) != 0:
    os.write(2, f"setting the network namespace \"{name}\" failed: "
                f"{os.strerror(ctypes.get_errno())}\n".encode())
    os._exit(255)
  os.close(fd)


def _new_stdio(unbuffered):
  """The server's stdio objects, on the child's descriptors 0-2 now, with
  the buffering `python` gives them (handlers keep these objects)."""
  sys.stdout.reconfigure(line_buffering=os.isatty(1),
                         write_through=unbuffered)
  sys.stderr.reconfigure(line_buffering=True, write_through=True)


def _die_with(pid):
  """The launcher's die-with-parent (prctl PDEATHSIG names the parent,
  which here is the server): SIGKILL when `pid` ends."""
  try:
    watched = os.pidfd_open(pid)
  except OSError:
    os._exit(128 + int(signal.SIGKILL))

  def watch():
    select.select([watched], [], [])
    os.kill(os.getpid(), signal.SIGKILL)

  threading.Thread(target=watch, daemon=True,
                   name="fork_start_die_with_parent").start()


def _run_as_main(source, filename, file=None):
  """Executes `source` as a fresh __main__ module (with `__file__` if
  given), as python does a script or -c."""
  main = types.ModuleType("__main__")
  if file is not None:
    main.__file__ = file
  main.__builtins__ = __builtins__
  sys.modules["__main__"] = main
  exec(compile(source, filename, "exec"), main.__dict__)  # noqa: S102


def _run(request):
  """Runs the program as `python` would; its exit status."""
  import runpy
  import traceback
  sys.argv = list(request["argv"])
  code = 0
  try:
    if request["kind"] == "module":
      sys.path[0] = os.getcwd()
      runpy._run_module_as_main(request["target"], alter_argv=True)  # noqa: SLF001
    elif request["kind"] == "code":
      sys.path[0] = ""  # python -c: the working directory
      _run_as_main(request["target"], "<string>")
    else:
      path = os.path.abspath(request["target"])
      sys.path[0] = os.path.dirname(os.path.realpath(path))
      with open(path, "rb") as source:
        _run_as_main(source.read(), path, file=path)
  except SystemExit as exit_:
    code = _exit_code(exit_.code)
  except KeyboardInterrupt:
    code = -1
  except BaseException:  # noqa: BLE001 - as the interpreter does
    traceback.print_exc()
    code = 1
  try:
    threading._shutdown()  # noqa: SLF001 - the interpreter's exit joins
    import atexit
    atexit._run_exitfuncs()  # noqa: SLF001
  except BaseException:  # noqa: BLE001
    traceback.print_exc()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  if code == -1:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    code = 130
  return code


def _exit_code(value):
  if value is None:
    return 0
  if isinstance(value, int):
    return value & 0xFF
  sys.stderr.write(f"{value}\n")
  return 1


# The session's side.

def start_session(directory):
  """Turns forked starts on for this process and its children."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "namespaces"), "w") as f:
    f.write(_namespaces() or "")
  os.environ[DIR_ENV] = directory
  put_site_on_path()
  install()


def put_site_on_path():
  """Puts fork_site (its sitecustomize) first on this process's and its
  children's PYTHONPATH."""
  site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_site")
  paths = [site] + [p for p in os.environ.get("PYTHONPATH", "").split(
      os.pathsep) if p and p != site]
  os.environ["PYTHONPATH"] = os.pathsep.join(paths)


def stop_session(directory):
  """Stops the session's servers (with CPU_ENV set, first appends each
  server's own CPU seconds to that file: its imports, and what it did
  between forks; its argv field holds what its start environment has
  that this process's has not)."""
  try:
    with open(os.path.join(directory, "servers")) as f:
      pids = [int(line) for line in f if line.strip()]
  except OSError:
    pids = []
  if os.environ.get(CPU_ENV):
    _record_servers(directory, pids, os.environ[CPU_ENV])
  for pid in pids:
    try:
      os.killpg(pid, signal.SIGKILL)
    except OSError:
      pass


def _record_servers(directory, pids, cpu_log):
  own = _start_environment(os.environ)
  starts = {}
  for name in os.listdir(directory):
    if name.endswith(".start"):
      with open(os.path.join(directory, name)) as f:
        starts[name[:-len(".start")]] = json.load(f)
  lines = []
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        path = [a for a in f.read().decode().split("\0")
                if a.endswith(".sock")][-1]
    except (OSError, IndexError):
      continue
    seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    start = starts.get(os.path.basename(path)[:-len(".sock")], {})
    differs = sorted(f"{k}={v}" for k, v in start.items() if own.get(k) != v)
    differs += sorted(f"-{k}" for k in own if k not in start)
    lines.append(f"{seconds:.2f}\t<fork server>\t"
                 f"{json.dumps(differs)}\n")
  with open(cpu_log, "a") as f:
    f.writelines(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
  _serve(sys.argv[2])
