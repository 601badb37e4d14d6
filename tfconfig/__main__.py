"""python -m tfconfig: show, launch, and print TF_CONFIG clusters.

  python -m tfconfig show
      Validates $TF_CONFIG and prints one line per task.
  python -m tfconfig launch --workers 2 [--chief] [--ps 1] [--evaluator] \\
      [--evaluator_wait S] [--timeout S] [--isolation MODE] \\
      -- python train.py --flag ...
      Runs every task locally on free loopback ports, closed to every other
      host and local user (an nftables table as root, else a private
      network namespace; --isolation open leaves them open); output lines
      are prefixed with the task; exits non-zero naming a task that fails.
      SIGINT, SIGTERM and SIGHUP stop every task; the exit code is then
      128 + the signal's number.
  python -m tfconfig guard [--isolation auto|firewall|open] -- CMD ...
      Runs CMD (a task of a multi-host job, TF_CONFIG set) with its port
      closed to every address but its cluster's hosts' (root), or says in
      one line how to close it.
  python -m tfconfig print --workers h1:2222 h2:2222 [--chief h0:2222] \\
      [--ps h3:2222]
      Prints the TF_CONFIG value of every task, for a multi-machine job.
  python -m tfconfig launch --netns auto [--link_rate 1gbit] --workers 2 ...
      The same launch with each task on a host of its own: a network
      namespace with its own address on a private link (root).
  python -m tfconfig testbed up|down [--hosts N] [--name NAME] [--rate R]
      Makes (or removes) such hosts for rehearsing a cluster by hand.
  python -m tfconfig tfjob --name NAME --image IMAGE --workers 4 [--chief] \\
      [--ps N] [--evaluator] [--pvc CLAIM --mount_path /runs] -- CMD ...
      Prints a Kubeflow TFJob (kubeflow.org/v1) for the job, as YAML, and
      a NetworkPolicy that admits to its pods' port only the job's pods.
  srun python -m tfconfig slurm [--chief] [--ps N] -- CMD ...
      Runs CMD with the TF_CONFIG of this Slurm task (from SLURM_*), its
      port guarded as by 'guard'.
"""

import argparse
import json
import os
import signal
import sys

from clusterspec import closing as closed
from clusterspec import config as tfc
from tfconfig import launch as tfl


def _show(args):
  del args
  text = os.environ.get("TF_CONFIG")
  if not text:
    print("TF_CONFIG is not set: this process would train on its own.")
    return 0
  print(tfc.describe(tfc.parse(text)))
  return 0


def _launch(args):
  command = args.command
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    raise tfc.TFConfigError("launch needs a command after --")
  for flag, value in (("--workers", args.workers), ("--ps", args.ps)):
    if value < 0:
      raise tfc.TFConfigError(f"{flag} must be >= 0, got {value}")
  tasks = args.workers + int(args.chief) + args.ps + int(args.evaluator)
  if tasks > tfl.MAX_LOCAL_TASKS:
    raise tfc.TFConfigError(
        f"--workers {args.workers} --ps {args.ps}: {tasks} tasks, but a local "
        f"launch runs at most {tfl.MAX_LOCAL_TASKS} on this machine; for a "
        "larger cluster give each machine its TF_CONFIG (python -m tfconfig "
        "print)")
  if args.workers == 0 and not args.chief:
    raise tfc.TFConfigError(
        "launch needs at least one training task, got --workers 0 and no "
        "chief")
  if not args.evaluator_wait >= 0:
    raise tfc.TFConfigError(
        f"--evaluator_wait must be a number of seconds >= 0, got "
        f"{args.evaluator_wait}")
  if args.evaluator_wait > 0 and not args.evaluator:
    raise tfc.TFConfigError(
        f"--evaluator_wait {args.evaluator_wait:g} needs --evaluator")
  if not args.grace >= 0:
    raise tfc.TFConfigError(
        f"--grace must be a number of seconds >= 0, got {args.grace}")
  if args.timeout is not None and not args.timeout > 0:
    raise tfc.TFConfigError(
        f"--timeout must be a number of seconds > 0, got {args.timeout}")
  if args.restart < 0:
    raise tfc.TFConfigError(f"--restart must be >= 0, got {args.restart}")
  if args.link_rate and not args.netns:
    raise tfc.TFConfigError(f"--link_rate {args.link_rate} needs --netns")
  tfl.check_command(command, "chief:0" if args.chief else "worker:0")
  if args.netns:
    return _launch_on_testbed(args, command, tasks)
  cluster = tfl.local_cluster(args.workers, chief=args.chief, ps=args.ps,
                              evaluator=args.evaluator)
  _print_cluster(cluster)
  return tfl.run_cluster(command, cluster, timeout=args.timeout,
                         evaluator_wait=args.evaluator_wait,
                         grace=args.grace, restarts=args.restart,
                         isolation=args.isolation)


def _print_cluster(cluster, hosts=None):
  print("[tfconfig] cluster " + " ".join(
      f"{t}:{i}={cluster['cluster'][t][i]}" +
      (f"@{hosts[(t, i)]}" if hosts else "")
      for t, i in tfc.tasks(cluster)), file=sys.stderr, flush=True)


def _launch_on_testbed(args, command, count):
  """Each task in a network namespace of its own (tfconfig/testbed.py)."""
  from tfconfig import testbed

  made = args.netns == "auto"
  bed = testbed.TestBed(count, name=None if made else args.netns,
                        rate=args.link_rate)
  try:
    if made:
      bed.up()
    elif bed.host(count - 1) not in testbed.namespaces(bed.name):
      raise tfc.TFConfigError(
          f"--netns {args.netns}: no namespace {bed.host(count - 1)}; make "
          f"the test bed first: python -m tfconfig testbed up --name "
          f"{args.netns} --hosts {count}")
    cluster = bed.cluster(args.workers, chief=args.chief, ps=args.ps,
                          evaluator=args.evaluator)
    order = {task: host for host, task in enumerate(tfc.tasks(cluster))}
    _print_cluster(cluster, {task: bed.host(host)
                             for task, host in order.items()})
    # Each task is a host of its own: it guards its own port, in its own
    # namespace, against every address but the cluster's.
    guard = [] if args.isolation == "open" else [
        sys.executable, "-m", "tfconfig", "guard", "--isolation",
        "auto" if args.isolation == "auto" else "firewall", "--"]
    return tfl.run_cluster(
        command, cluster, timeout=args.timeout,
        evaluator_wait=args.evaluator_wait, grace=args.grace,
        restarts=args.restart, isolation="open",
        task_prefix=lambda t, i: bed.exec_prefix(order[(t, i)]) + guard)
  except testbed.TestBedError as error:
    raise tfc.TFConfigError(str(error)) from None
  finally:
    if made:
      bed.down()


def _command(args):
  command = args.command
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    raise tfc.TFConfigError(f"{args.verb} needs a command after --")
  return command


def _tfjob(args):
  import yaml

  from tfconfig import engines

  manifest = engines.tfjob_manifest(
      args.name, args.image, _command(args), args.workers, chief=args.chief,
      ps=args.ps, evaluator=args.evaluator, namespace=args.namespace,
      restart_policy=args.restart_policy, backoff_limit=args.backoff_limit,
      pvc=args.pvc, mount_path=args.mount_path,
      grace_seconds=args.grace_seconds)
  documents = [manifest]
  if not args.no_network_policy:
    documents.append(engines.tfjob_network_policy(manifest))
  print(yaml.safe_dump_all(documents, sort_keys=False), end="")
  return 0


def _guarded_exec(command, env, isolation, name):
  """Closes this task's port (clusterspec/closing.py), then runs `command` in
  this process: the holder of its table is this process's child and dies
  with it, however it ends."""
  closure = closed.guard_task(json.loads(env["TF_CONFIG"]), isolation)
  env = dict(env, **{closed.CLOSED_BY_ENV: f"tfconfig guard:{closure.mode}"})
  if closure.description:
    print(f"[tfconfig] {closure.description}", file=sys.stderr, flush=True)
  closure.keep_across_exec()
  try:
    os.execvpe(command[0], command, env)
  except OSError as error:
    closure.close()
    raise tfl.LaunchError(f"cannot start {name}: {command[0]!r}: "
                          f"{error.strerror or error}") from None


def _guard(args):
  command = _command(args)
  text = os.environ.get("TF_CONFIG")
  if not text:
    raise tfc.TFConfigError("guard needs TF_CONFIG (this task's cluster and "
                            "place) in its environment")
  config = tfc.parse(text)
  task = config["task"]
  name = f"{task['type']}:{task['index']}"
  tfl.check_command(command, name)
  return _guarded_exec(command, dict(os.environ), args.isolation, name)


def _slurm(args):
  from tfconfig import engines

  command = _command(args)
  config = engines.slurm_tf_config(chief=args.chief, ps=args.ps,
                                   port_base=args.port_base,
                                   gpus_per_task=args.gpus_per_task)
  task = config["task"]
  print(f"[tfconfig] slurm rank {os.environ['SLURM_PROCID']}: "
        f"{task['type']}:{task['index']} of {len(tfc.tasks(config))}",
        file=sys.stderr, flush=True)
  tfl.check_command(command, f"{task['type']}:{task['index']}")
  env = dict(os.environ, TF_CONFIG=json.dumps(tfc.tensorflow_form(config)))
  if args.print_only:
    print(env["TF_CONFIG"])
    return 0
  return _guarded_exec(command, env, args.isolation,
                       f"{task['type']}:{task['index']}")


def _testbed(args):
  from tfconfig import testbed

  try:
    if args.action == "up":
      bed = testbed.TestBed(args.hosts, name=args.name, rate=args.rate).up()
      for index in range(bed.hosts):
        print(f"{bed.host(index)}  {bed.address(index)}")
    else:
      removed = testbed.remove_leftovers(args.name or testbed.PREFIX)
      print(f"removed {len(removed)} namespace(s)"
            + (": " + " ".join(removed) if removed else ""))
  except (testbed.TestBedError, ValueError) as error:
    raise tfc.TFConfigError(str(error)) from None
  return 0


def _print(args):
  cluster = tfc.build(workers=args.workers, chief=args.chief, ps=args.ps,
                      evaluator=args.evaluator)
  for task_type, index in tfc.tasks(cluster):
    value = json.dumps(tfc.for_task(cluster, task_type, index),
                       separators=(",", ":"))
    print(f"# {task_type}:{index} on {cluster['cluster'][task_type][index]}")
    print(f"TF_CONFIG='{value}'")
  return 0


def _parser():
  """The command line: one subcommand per verb."""
  parser = argparse.ArgumentParser(prog="python -m tfconfig",
                                   description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="verb", required=True)
  commands.add_parser("show", help="validate and describe $TF_CONFIG")
  for add in (_add_launch, _add_print, _add_testbed, _add_tfjob, _add_slurm,
              _add_guard):
    add(commands)
  return parser


def _add_launch(commands):
  launch = commands.add_parser("launch", help="run a local cluster")
  launch.add_argument("--workers", type=int, default=2,
                      help="worker tasks (default 2)")
  launch.add_argument("--chief", action="store_true",
                      help="add a chief task (needed with --ps)")
  launch.add_argument("--ps", type=int, default=0,
                      help="parameter-server tasks (default 0)")
  launch.add_argument("--evaluator", action="store_true",
                      help="add an evaluator task (stopped when training "
                      "ends, unless --evaluator_wait)")
  launch.add_argument("--evaluator_wait", type=float, default=0, metavar="S",
                      help="seconds the evaluator may run on after training, "
                      "to evaluate the final checkpoint (default 0)")
  launch.add_argument("--timeout", type=float, default=None,
                      help="seconds before every task is stopped and the "
                      "launch fails (default: none)")
  launch.add_argument("--grace", type=float, default=tfl.STOP_GRACE_SECONDS,
                      metavar="S",
                      help="seconds a stopped task has between SIGTERM and "
                      f"SIGKILL (default {tfl.STOP_GRACE_SECONDS})")
  launch.add_argument("--restart", type=int, default=0, metavar="N",
                      help="start the whole job again after a task fails, "
                      "up to N times (as a TFJob's restartPolicy: OnFailure; "
                      "default 0)")
  launch.add_argument("--netns", metavar="NAME|auto",
                      help="run each task in a network namespace of its own "
                      "(root): 'auto' makes a test bed for this launch and "
                      "removes it after; NAME uses one made by 'testbed up'")
  launch.add_argument("--link_rate", metavar="RATE",
                      help="with --netns auto: shape every link (tc rate, "
                      "e.g. 1gbit)")
  launch.add_argument("--isolation", default="auto",
                      choices=closed.MODES,
                      help="how the tasks' ports are closed to other hosts "
                      "and local users: auto (default: an nftables table "
                      "where allowed, else a private network namespace), "
                      "firewall, namespace, or open (no closing)")
  launch.add_argument("command", nargs=argparse.REMAINDER,
                      help="-- then the command every task runs")


def _add_print(commands):
  printer = commands.add_parser("print", help="per-task TF_CONFIG values")
  printer.add_argument("--workers", nargs="+", required=True,
                       metavar="HOST:PORT", help="one address per worker")
  printer.add_argument("--chief", metavar="HOST:PORT",
                       help="the chief's address")
  printer.add_argument("--ps", nargs="*", default=[], metavar="HOST:PORT",
                       help="one address per parameter server")
  printer.add_argument("--evaluator", metavar="HOST:PORT",
                       help="the evaluator's address")


def _add_testbed(commands):
  bed = commands.add_parser(
      "testbed", help="hosts as network namespaces on one machine (root)")
  bed.add_argument("action", choices=["up", "down"],
                   help="up: make NAME's hosts; down: remove them (without "
                   "--name: every test bed's leftovers)")
  bed.add_argument("--hosts", type=int, default=2)
  bed.add_argument("--name", default=None)
  bed.add_argument("--rate", default=None, help="tc rate of every link")


def _add_tfjob(commands):
  from tfconfig import engines

  tfjob = commands.add_parser("tfjob", help="print a Kubeflow TFJob")
  tfjob.add_argument("--name", required=True, help="the job's name")
  tfjob.add_argument("--image", required=True, help="the container image")
  tfjob.add_argument("--namespace", default="default")
  tfjob.add_argument("--workers", type=int, default=2)
  tfjob.add_argument("--chief", action="store_true")
  tfjob.add_argument("--ps", type=int, default=0)
  tfjob.add_argument("--evaluator", action="store_true")
  tfjob.add_argument("--restart_policy", default="ExitCode",
                     choices=engines.RESTART_POLICIES,
                     help="ExitCode (default): restart a task that lost a "
                     "peer or was killed, not one with a bad flag")
  tfjob.add_argument("--backoff_limit", type=int, default=3)
  tfjob.add_argument("--pvc", help="a ReadWriteMany claim holding the "
                     "shared model_dir")
  tfjob.add_argument("--mount_path", help="where --pvc is mounted")
  tfjob.add_argument("--grace_seconds", type=int,
                     default=engines.DEFAULT_GRACE_SECONDS,
                     help="every pod's terminationGracePeriodSeconds; a pod "
                     "told to stop saves its window within all but "
                     f"{engines.GRACE_MARGIN_SECONDS} s of it")
  tfjob.add_argument("--no_network_policy", action="store_true",
                     help="print the TFJob alone, without the NetworkPolicy "
                     "that admits to its pods' port only the job's pods")
  tfjob.add_argument("command", nargs=argparse.REMAINDER)


def _add_slurm(commands):
  slurm = commands.add_parser("slurm", help="run a command with the "
                              "TF_CONFIG of this Slurm task")
  slurm.add_argument("--chief", action="store_true",
                     help="rank 0 is the chief (parameter-server jobs)")
  slurm.add_argument("--ps", type=int, default=0)
  slurm.add_argument("--port_base", type=int, default=8888)
  slurm.add_argument("--gpus_per_task", type=int, default=0)
  slurm.add_argument("--print_only", action="store_true",
                     help="print the TF_CONFIG instead of running")
  _add_host_isolation(slurm)
  slurm.add_argument("command", nargs=argparse.REMAINDER)


def _add_host_isolation(parser):
  parser.add_argument("--isolation", default="auto",
                      choices=closed.HOST_MODES,
                      help="auto (default): close this task's port to every "
                      "address but the cluster's hosts' where allowed "
                      "(root), else say how in one line and go on; "
                      "firewall: fail if it cannot; open: leave it open")


def _add_guard(commands):
  guard = commands.add_parser(
      "guard", help="run a task of a multi-host job with its port closed "
      "to all but its peers")
  _add_host_isolation(guard)
  guard.add_argument("command", nargs=argparse.REMAINDER)


def main(argv=None):
  parser = _parser()
  args = parser.parse_args(argv)
  try:
    return {"show": _show, "launch": _launch, "print": _print,
            "testbed": _testbed, "tfjob": _tfjob,
            "slurm": _slurm, "guard": _guard}[args.verb](args)
  except tfc.TFConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  except tfl.LaunchError as error:
    print(f"error: {error}", file=sys.stderr)
    return tfl.CANNOT_START
  except closed.ClosingError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    # Ctrl-C before the launch's own handlers are set: nothing started yet.
    print("[tfconfig] interrupted", file=sys.stderr)
    return 128 + int(signal.SIGINT)


if __name__ == "__main__":
  sys.exit(main())
