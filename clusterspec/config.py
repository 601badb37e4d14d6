"""Build, parse and validate TF_CONFIG, the JSON that describes a cluster.

```python
config = tfconfig.build(workers=["10.0.0.1:2222", "10.0.0.2:2222"],
                        chief="10.0.0.0:2222", task=("worker", 1))
os.environ["TF_CONFIG"] = json.dumps(config)
tfconfig.parse(os.environ["TF_CONFIG"])   # dict, or TFConfigError
```

Every problem is reported as a `TFConfigError` (a ValueError) with one line
that names it and says the value may come from the TF_CONFIG variable.

The shapes the engines set are accepted: `master` (SageMaker's
parameter-server mode, AI Platform's older runtimes) is the chief; Vertex
AI's worker pools (`workerpool0..3` in its CLUSTER_SPEC) are the chief, the
workers, the parameter servers and the evaluator; the evaluator may be in
the cluster (Kubeflow's TFJob, Volcano) or only in "task" (TensorFlow's own
form); other keys ("environment", "job", "trial", "cloud") are ignored.
`use_environment(strategy)` checks the job's cluster against its strategy
and rewrites TF_CONFIG in the form TensorFlow reads.
"""

import copy
import json
import os
import re

CLUSTER = "cluster"
TASK = "task"
TYPE = "type"
INDEX = "index"
CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
TASK_TYPES = (CHIEF, WORKER, PS, EVALUATOR)
TRAINING_TYPES = (CHIEF, WORKER)
MASTER = "master"
# The engines' names for TensorFlow's task types: "master" (SageMaker, AI
# Platform), Vertex AI's worker pools (its CLUSTER_SPEC variable).
ALIASES = {MASTER: CHIEF, "workerpool0": CHIEF, "workerpool1": WORKER,
           "workerpool2": PS, "workerpool3": EVALUATOR}
MULTI_WORKER = "multi_worker"
PARAMETER_SERVER = "parameter_server"


class TFConfigError(ValueError):
  """A TF_CONFIG that cannot describe a cluster; the message is one line."""


# A bad value is quoted in an error up to this many characters.
QUOTE_LIMIT = 200
_ASCII_DIGITS = re.compile(r"[0-9]+")
# A DNS name has at most 253 characters; an IPv6 address in brackets fewer.
_MAX_HOST = 255


def _fail(message):
  raise TFConfigError(f"TF_CONFIG: {message}")


def _quote(value):
  """repr(value), at most QUOTE_LIMIT characters (then its length)."""
  text = repr(value)
  if len(text) <= QUOTE_LIMIT:
    return text
  return f"{text[:QUOTE_LIMIT]}... ({len(text)} characters)"


def _check_address(address, where):
  if not isinstance(address, str) or address.count(":") < 1:
    _fail(f"{where} address {_quote(address)} has no port; expected "
          "host:port")
  host, _, port = address.rpartition(":")
  if len(host) > _MAX_HOST:
    _fail(f"{where} address {_quote(address)} has a host of {len(host)} "
          f"characters; a host name has at most {_MAX_HOST}")
  if (not host or not _ASCII_DIGITS.fullmatch(port) or len(port) > 5 or
      not 0 < int(port) < 65536):
    _fail(f"{where} address {_quote(address)} is not host:port with a port "
          "in 1..65535")


def _canonical_types(config):
  """`config` with the engines' task type names (ALIASES) replaced by
  TensorFlow's; the same dict when it has none."""
  cluster = config.get(CLUSTER)
  task = config.get(TASK)
  renamed = isinstance(cluster, dict) and any(t in ALIASES for t in cluster)
  renamed |= isinstance(task, dict) and task.get(TYPE) in ALIASES
  if not renamed:
    return config
  new_cluster = {}
  for task_type, addresses in cluster.items():
    canonical = ALIASES.get(task_type, task_type)
    if canonical in new_cluster:
      _fail(f"'{CLUSTER}' names the {canonical} twice ({canonical!r} and "
            f"{task_type!r}: {', '.join(cluster)}); give one of them")
    new_cluster[canonical] = addresses
  config = dict(config, **{CLUSTER: new_cluster})
  if isinstance(task, dict) and task.get(TYPE) in ALIASES:
    config[TASK] = dict(task, **{TYPE: ALIASES[task[TYPE]]})
  return config


def validate(config, require_chief=False):
  """Checks a TF_CONFIG dict; returns it with TensorFlow's task type names.

  Args:
    config: dict with "cluster" and optionally "task" (other keys are
      kept and not read); "master" and Vertex AI's "workerpoolN" are
      renamed to TensorFlow's types (ALIASES).
    require_chief: bool, whether the cluster must have a chief (parameter
      server training does).

  Raises:
    TFConfigError: naming the first problem found.
  """
  if not isinstance(config, dict):
    _fail(f"expected a JSON object, got {type(config).__name__}")
  config = _canonical_types(config)
  cluster = config.get(CLUSTER)
  if not isinstance(cluster, dict) or not cluster:
    _fail(f"'{CLUSTER}' must be a non-empty object of task type -> "
          f"addresses, got {_quote(cluster)}")
  for task_type, addresses in cluster.items():
    if task_type not in TASK_TYPES:
      _fail(f"unknown task type {_quote(task_type)} in '{CLUSTER}'; "
            f"expected one of {', '.join(TASK_TYPES + tuple(ALIASES))}")
    if not isinstance(addresses, list) or not addresses:
      _fail(f"'{CLUSTER}.{task_type}' must be a non-empty list of "
            f"host:port, got {_quote(addresses)}")
    for index, address in enumerate(addresses):
      _check_address(address, f"{task_type}:{index}")
  owners = {}
  for task_type, addresses in cluster.items():
    for index, address in enumerate(addresses):
      owner = owners.setdefault(address, f"{task_type}:{index}")
      if owner != f"{task_type}:{index}":
        _fail(f"address {_quote(address)} is given to both {owner} and "
              f"{task_type}:{index}; every task needs its own host:port")
  if len(cluster.get(CHIEF, [])) > 1:
    _fail(f"a cluster has at most one chief, got {len(cluster[CHIEF])}")
  if require_chief and CHIEF not in cluster:
    _fail(f"this job needs a chief, and '{CLUSTER}' has none (task types: "
          f"{', '.join(cluster)})")
  if PS in cluster and CHIEF not in cluster:
    _fail(f"parameter-server training needs a chief (or master); "
          f"'{CLUSTER}' has ps but no chief")
  task = config.get(TASK)
  if task is not None:
    if not isinstance(task, dict):
      _fail(f"'{TASK}' must be an object with 'type' and 'index', got "
            f"{_quote(task)}")
    task_type, index = task.get(TYPE), _task_index(task.get(INDEX, 0))
    if task_type not in TASK_TYPES:
      _fail(f"unknown task type {_quote(task_type)} in '{TASK}'; expected "
            f"one of {', '.join(TASK_TYPES + tuple(ALIASES))}")
    if task_type == EVALUATOR and EVALUATOR not in cluster:
      # TensorFlow's own form: the evaluator is not part of the training
      # cluster, only named in "task", and its index has no upper bound.
      if index < 0:
        _fail(f"task index {_quote(index)} of the evaluator must be >= 0")
      return config
    if task_type not in cluster:
      _fail(f"task type {task_type!r} is not in '{CLUSTER}' (which has "
            f"{', '.join(cluster)})")
    if not 0 <= index < len(cluster[task_type]):
      _fail(f"task index {_quote(index)} is out of range for {task_type!r}, "
            f"which has {len(cluster[task_type])} task(s)")
  return config


def _task_index(index):
  """The task's index as TensorFlow reads it (`int(index)`: a number, or a
  string of digits); TFConfigError for anything else."""
  if isinstance(index, int) and not isinstance(index, bool):
    return index
  if isinstance(index, str) and re.fullmatch(r"-?[0-9]+", index.strip()):
    return int(index)
  _fail(f"task index {_quote(index)} is not an integer (a JSON number such "
        "as 0)")


def parse(text, require_chief=False):
  """Parses and validates TF_CONFIG text; returns the dict.

  Raises:
    TFConfigError: for bad JSON (with line and column) or a bad cluster.
  """
  try:
    config = json.loads(text)
  except json.JSONDecodeError as error:
    _fail(f"not valid JSON: {error.msg} at line {error.lineno} column "
          f"{error.colno}")
  except RecursionError:
    _fail("not a cluster: its JSON is nested too deeply")
  return validate(config, require_chief=require_chief)


def from_environment(require_chief=False):
  """The TF_CONFIG of this process, validated; {} when it is not set.

  Without TF_CONFIG, Vertex AI's CLUSTER_SPEC (worker pools) is read. The
  task's index is an int, whichever form TF_CONFIG gives it in.

  Raises:
    TFConfigError: naming the problem.
  """
  text = os.environ.get("TF_CONFIG") or os.environ.get("CLUSTER_SPEC")
  if not text:
    return {}
  # Read once per process (and again only if the variable changes): the
  # library asks at every stop check.
  key = (text, bool(require_chief))
  if key not in _READ:
    try:
      config = parse(text, require_chief=require_chief)
    except TFConfigError as error:
      _READ.clear()
      _READ[key] = error
      raise
    if config.get(TASK) is not None:
      config[TASK] = dict(config[TASK],
                          **{INDEX: _task_index(config[TASK].get(INDEX, 0))})
    _READ.clear()
    _READ[key] = config
  read = _READ[key]
  if isinstance(read, TFConfigError):
    raise TFConfigError(str(read))
  return copy.deepcopy(read)


# The last TF_CONFIG read: {(text, require_chief): its config or error}.
_READ = {}


def task_of(types):
  """This process's TF_CONFIG (as `from_environment`) when its task is of
  one of `types`; None when it is not, or TF_CONFIG is unset or invalid
  (for defaults that apply only in a cluster, and stay off otherwise)."""
  try:
    config = from_environment()
  except TFConfigError:
    return None
  task = config.get(TASK) or {}
  return config if task.get(TYPE) in types else None


def trainer_position(cluster, task_type, index):
  """(trainers, this task's index among them) of a cluster dict: the
  chief first, then the workers in order (one input pipeline each)."""
  chiefs = len(cluster.get(CHIEF, []))
  trainers = chiefs + len(cluster.get(WORKER, []))
  return trainers, int(index) + (chiefs if task_type == WORKER else 0)


def tensorflow_form(config):
  """What TensorFlow's Estimator and strategies read: "cluster" without the
  evaluator (TensorFlow keeps it out of the training cluster) and "task";
  the engines' other keys dropped."""
  form = {CLUSTER: {t: list(a) for t, a in config[CLUSTER].items()
                    if t != EVALUATOR}}
  if config.get(TASK) is not None:
    form[TASK] = {TYPE: config[TASK][TYPE],
                  INDEX: _task_index(config[TASK].get(INDEX, 0))}
  return form


def check_strategy(config, strategy):
  """Raises TFConfigError when `config`'s cluster cannot run `strategy`
  ("multi_worker" or "parameter_server"); returns `config`."""
  cluster = config.get(CLUSTER, {})
  types = ", ".join(f"{t} x{len(a)}" for t, a in cluster.items())
  if strategy == MULTI_WORKER:
    if PS in cluster:
      _fail(f"MultiWorkerMirroredStrategy has no parameter servers, and the "
            f"cluster has ps tasks ({types}; SageMaker's parameter-server "
            "mode and a TFJob with PS replicas set them): train with "
            "--distribution_strategy=parameter_server, or drop the ps")
    if not set(cluster) & set(TRAINING_TYPES):
      _fail(f"MultiWorkerMirroredStrategy needs workers (or a chief); the "
            f"cluster has {types or 'none'}")
  elif strategy == PARAMETER_SERVER:
    if PS not in cluster:
      _fail(f"parameter-server training needs ps tasks; the cluster has "
            f"{types or 'none'}")
    if CHIEF not in cluster:
      _fail(f"parameter-server training needs a chief (or master); the "
            f"cluster has {types}")
  elif strategy is not None:
    raise ValueError(f"strategy must be {MULTI_WORKER!r}, "
                     f"{PARAMETER_SERVER!r} or None, got {strategy!r}")
  return config


def use_environment(strategy=None):
  """Reads this process's cluster (TF_CONFIG, else Vertex AI's
  CLUSTER_SPEC), checks it against `strategy`, and sets TF_CONFIG to
  TensorFlow's form of it, so that Estimator and the strategies accept
  what the engines set. Returns the validated dict ({} without a cluster).

  Raises:
    TFConfigError: naming the problem, in one line.
  """
  config = from_environment(require_chief=strategy == PARAMETER_SERVER)
  if not config:
    return {}
  check_strategy(config, strategy)
  os.environ["TF_CONFIG"] = json.dumps(tensorflow_form(config))
  return config


def build(workers, chief=None, ps=(), evaluator=None, task=None):
  """Returns a validated TF_CONFIG dict.

  Args:
    workers: list of "host:port" for the workers.
    chief: optional "host:port" of the chief.
    ps: list of "host:port" for parameter servers.
    evaluator: optional "host:port" of the evaluator. (TensorFlow expects the
      evaluator in "task" only; it is listed in the cluster here so that the
      launcher can address it, and removed by `for_task` where it must be.)
    task: optional (type, index) of the task this config is for.
  """
  cluster = {}
  if chief:
    cluster[CHIEF] = [chief]
  if workers:
    cluster[WORKER] = list(workers)
  if ps:
    cluster[PS] = list(ps)
  if evaluator:
    cluster[EVALUATOR] = [evaluator]
  config = {CLUSTER: cluster}
  if task is not None:
    config[TASK] = {TYPE: task[0], INDEX: task[1]}
  return validate(config)


def for_task(config, task_type, index):
  """The TF_CONFIG value one task runs with, as TensorFlow expects it.

  The evaluator is not part of the training cluster: TensorFlow wants it only
  in "task", so it is dropped from "cluster" here.
  """
  cluster = {t: a for t, a in config[CLUSTER].items() if t != EVALUATOR}
  return validate({CLUSTER: cluster, TASK: {TYPE: task_type, INDEX: index}})


def tasks(config):
  """All (type, index) pairs of a cluster, chief first."""
  ordered = sorted(config[CLUSTER], key=TASK_TYPES.index)
  return [(t, i) for t in ordered for i in range(len(config[CLUSTER][t]))]


def describe(config):
  """One line per task: `worker:1  10.0.0.2:2222  (this task)`."""
  this = config.get(TASK) or {}
  this_type, this_index = this.get(TYPE), _task_index(this.get(INDEX, 0))
  lines = []
  for task_type, index in tasks(config):
    marker = ""
    if this_type == task_type and this_index == index:
      marker = "  (this task)"
    lines.append(f"{task_type}:{index}  "
                 f"{config[CLUSTER][task_type][index]}{marker}")
  if this_type == EVALUATOR and EVALUATOR not in config[CLUSTER]:
    lines.append(f"{EVALUATOR}:{this_index}  (this task; not part of the "
                 "training cluster)")
  return "\n".join(lines)
