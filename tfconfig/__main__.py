"""python -m tfconfig: show, launch, and print TF_CONFIG clusters.

  python -m tfconfig show
      Validates $TF_CONFIG and prints one line per task.
  python -m tfconfig launch --workers 2 [--chief] [--ps 1] [--evaluator] \\
      [--timeout S] -- python train.py --flag ...
      Runs every task locally on free loopback ports; output lines are
      prefixed with the task; exits non-zero naming a task that fails.
  python -m tfconfig print --workers h1:2222 h2:2222 [--chief h0:2222] \\
      [--ps h3:2222]
      Prints the TF_CONFIG value of every task, for a multi-machine job.
"""

import argparse
import json
import os
import sys

from tfconfig import config as tfc
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
  if args.workers < 0 or args.ps < 0 or (args.workers == 0 and not args.chief):
    raise tfc.TFConfigError(
        f"launch needs at least one training task, got --workers "
        f"{args.workers} and {'a' if args.chief else 'no'} chief")
  cluster = tfl.local_cluster(args.workers, chief=args.chief, ps=args.ps,
                              evaluator=args.evaluator)
  print("[tfconfig] cluster " + " ".join(
      f"{t}:{i}={cluster['cluster'][t][i]}" for t, i in tfc.tasks(cluster)),
        flush=True)
  return tfl.run_cluster(command, cluster, timeout=args.timeout)


def _print(args):
  cluster = tfc.build(workers=args.workers, chief=args.chief, ps=args.ps,
                      evaluator=args.evaluator)
  for task_type, index in tfc.tasks(cluster):
    value = json.dumps(tfc.for_task(cluster, task_type, index),
                       separators=(",", ":"))
    print(f"# {task_type}:{index} on {cluster['cluster'][task_type][index]}")
    print(f"TF_CONFIG='{value}'")
  return 0


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m tfconfig",
                                   description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="verb", required=True)
  commands.add_parser("show", help="validate and describe $TF_CONFIG")
  launch = commands.add_parser("launch", help="run a local cluster")
  launch.add_argument("--workers", type=int, default=2)
  launch.add_argument("--chief", action="store_true")
  launch.add_argument("--ps", type=int, default=0)
  launch.add_argument("--evaluator", action="store_true")
  launch.add_argument("--timeout", type=float, default=None)
  launch.add_argument("command", nargs=argparse.REMAINDER)
  printer = commands.add_parser("print", help="per-task TF_CONFIG values")
  printer.add_argument("--workers", nargs="+", required=True)
  printer.add_argument("--chief")
  printer.add_argument("--ps", nargs="*", default=[])
  printer.add_argument("--evaluator")
  args = parser.parse_args(argv)
  try:
    return {"show": _show, "launch": _launch, "print": _print}[args.verb](args)
  except tfc.TFConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
