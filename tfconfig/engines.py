"""What the engines need from us: a TFJob to apply, a TF_CONFIG under Slurm.

Kubeflow's training operator (`kubeflow.org/v1` TFJob) starts one pod per
replica and gives each the TF_CONFIG `tfjob_tf_config` computes (its
documented shape: `<job>-<type>-<i>.<namespace>.svc:2222`, the evaluator in
the cluster, `"environment": "cloud"`). `tfjob_manifest` writes the TFJob:
a container named `tensorflow` in every replica, port 2222, the restart
policy `ExitCode` by default (Kubeflow retries exit codes 128..255, so a
task that lost a peer, exit 150, or was killed is restarted, and a bad flag
or a diverged run, 1..127, is not), the job's shared storage mounted
in every pod, and the pods' grace period with the stop's bound inside it
(a pod told to stop saves its open window and exits 143; docs/operations.md).

Slurm sets no TF_CONFIG; `slurm_tf_config` computes it from the `SLURM_*`
variables of one `srun` task with TensorFlow's own `SlurmClusterResolver`
(ranks in the order of its jobs, ports from `port_base` on each node).
"""

import re

from clusterspec import closing as closed
from clusterspec import config as tfc

TFJOB_API_VERSION = "kubeflow.org/v1"
TFJOB_CONTAINER = "tensorflow"
TFJOB_PORT = 2222
# The operator's replica types for TensorFlow's task types.
REPLICA_TYPES = {tfc.CHIEF: "Chief", tfc.WORKER: "Worker", tfc.PS: "PS",
                 tfc.EVALUATOR: "Evaluator"}
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
# A pod's grace period (Kubernetes' default), and how much of it the stop
# on SIGTERM leaves for the rest: a parameter server serves 3 s past the
# stop's bound, and a process takes a moment to exit.
DEFAULT_GRACE_SECONDS = 30
GRACE_MARGIN_SECONDS = 10
MIN_GRACE_SECONDS = 15
STOP_SECONDS_ENV = "ESTIMATOR_ACCUM_STOP_SECONDS"
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def _check_name(what, value):
  if (not isinstance(value, str) or len(value) > 63 or
      not _DNS_1035.fullmatch(value)):
    raise tfc.TFConfigError(
        f"{what} {value!r} is not a DNS-1035 label (lower-case letters, "
        "digits and '-', starting with a letter, at most 63 characters)")


def _check_tfjob(name, namespace, image, command, workers, ps,
                 backoff_limit, restart_policy, grace_seconds, pvc,
                 mount_path):
  """Refuses a bad argument of `tfjob_manifest`, in one line naming the
  flag and the value."""
  _check_name("--name", name)
  _check_name("--namespace", namespace)
  if not image or not isinstance(image, str):
    raise tfc.TFConfigError("--image is required: every replica runs a "
                            "container image")
  if (isinstance(command, str) or not isinstance(command, (list, tuple)) or
      not command or not all(isinstance(a, str) for a in command)):
    shown = repr(command)
    raise tfc.TFConfigError(
        "command must be a non-empty list of str (the program and its "
        "arguments, a container's command), got "
        f"{shown if len(shown) <= 80 else shown[:77] + '...'}")
  for flag, value in (("--workers", workers), ("--ps", ps),
                      ("--backoff_limit", backoff_limit)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise tfc.TFConfigError(f"{flag} must be a whole number >= 0, got "
                              f"{value!r}")
  if restart_policy not in RESTART_POLICIES:
    raise tfc.TFConfigError(f"--restart_policy {restart_policy!r} is not one "
                            f"of {', '.join(RESTART_POLICIES)}")
  if (isinstance(grace_seconds, bool) or not isinstance(grace_seconds, int)
      or grace_seconds < MIN_GRACE_SECONDS):
    raise tfc.TFConfigError(
        f"--grace_seconds must be a whole number of seconds >= "
        f"{MIN_GRACE_SECONDS} (a micro-batch and the save, with "
        f"{GRACE_MARGIN_SECONDS} s to spare), got {grace_seconds!r}")
  if bool(pvc) != bool(mount_path):
    raise tfc.TFConfigError("--pvc and --mount_path go together (the shared "
                            "model_dir's claim and where it is mounted)")


def tfjob_manifest(name, image, command, workers, chief=False, ps=0,
                   evaluator=False, namespace="default",
                   restart_policy="ExitCode", backoff_limit=3,
                   pvc=None, mount_path=None,
                   grace_seconds=DEFAULT_GRACE_SECONDS):
  """A `kubeflow.org/v1` TFJob, as a dict ready for yaml.safe_dump.

  Args:
    name: the job's name, a DNS-1035 label.
    image: the container image every replica runs.
    command: list of str, the command every replica runs (its flags give
      the shared model_dir, e.g. under `mount_path`).
    workers, chief, ps, evaluator: the replicas, as `tfconfig launch`.
    namespace: the Kubernetes namespace.
    restart_policy: one of RESTART_POLICIES.
    backoff_limit: restarts of the job before it fails.
    pvc: optional name of a ReadWriteMany PersistentVolumeClaim mounted at
      `mount_path` in every pod (the shared model_dir).
    grace_seconds: int, every pod's `terminationGracePeriodSeconds`; the
      stop on SIGTERM gets all but `GRACE_MARGIN_SECONDS` of it
      (`ESTIMATOR_ACCUM_STOP_SECONDS` in every container).
  """
  _check_tfjob(name, namespace, image, command, workers, ps, backoff_limit,
               restart_policy, grace_seconds, pvc, mount_path)
  counts = {tfc.CHIEF: int(bool(chief)), tfc.WORKER: workers, tfc.PS: ps,
            tfc.EVALUATOR: int(bool(evaluator))}
  if counts[tfc.CHIEF] + workers < 1:
    raise tfc.TFConfigError("a TFJob needs a chief or at least one worker")
  container = {"name": TFJOB_CONTAINER, "image": image,
               "command": list(command),
               "ports": [{"name": "tfjob-port",
                          "containerPort": TFJOB_PORT}],
               "env": [{"name": STOP_SECONDS_ENV, "value": str(
                   grace_seconds - GRACE_MARGIN_SECONDS)}]}
  pod = {"terminationGracePeriodSeconds": grace_seconds,
         "containers": [container]}
  if pvc:
    container["volumeMounts"] = [{"name": "model-dir",
                                  "mountPath": mount_path}]
    pod["volumes"] = [{"name": "model-dir",
                       "persistentVolumeClaim": {"claimName": pvc}}]
  replicas = {}
  for task_type, count in counts.items():
    if count:
      replicas[REPLICA_TYPES[task_type]] = {
          "replicas": count, "restartPolicy": restart_policy,
          "template": {"spec": pod}}
  return {"apiVersion": TFJOB_API_VERSION, "kind": "TFJob",
          "metadata": {"name": name, "namespace": namespace},
          "spec": {"runPolicy": {"cleanPodPolicy": "Running",
                                 "backoffLimit": backoff_limit},
                   "tfReplicaSpecs": replicas}}


def tfjob_tf_config(manifest, task_type, index):
  """The TF_CONFIG the training operator gives pod `task_type`-`index` of
  `manifest` (its documented shape), as a dict."""
  name = manifest["metadata"]["name"]
  namespace = manifest["metadata"].get("namespace", "default")
  cluster = {}
  for replica_type, spec in manifest["spec"]["tfReplicaSpecs"].items():
    kind = replica_type.lower()
    cluster[kind] = [f"{name}-{kind}-{i}.{namespace}.svc:{TFJOB_PORT}"
                     for i in range(spec.get("replicas", 1))]
  return {"cluster": cluster, "task": {"type": task_type, "index": index},
          "environment": "cloud"}


def slurm_tf_config(chief=False, ps=0, port_base=8888, gpus_per_task=0):
  """This `srun` task's TF_CONFIG dict, from its SLURM_* variables.

  Args:
    chief: whether rank 0 is the chief (else every training task is a
      worker, worker 0 leading, as MultiWorkerMirroredStrategy wants).
    ps: parameter servers among the ranks.
    port_base: the first port on each node (SlurmClusterResolver's 8888).
    gpus_per_task: GPUs per task; > 0 also sets CUDA_VISIBLE_DEVICES for
      this task, as SlurmClusterResolver does.

  Raises:
    TFConfigError: a variable is missing or the ranks do not fit.
  """
  import os

  import tensorflow as tf

  missing = [name for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
                               "SLURM_STEP_NODELIST",
                               "SLURM_STEP_TASKS_PER_NODE")
             if name not in os.environ]
  if missing:
    raise tfc.TFConfigError(
        f"not a Slurm task: {', '.join(missing)} not set (run it under srun)")
  tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
  workers = tasks - int(bool(chief)) - ps
  if workers < 0 or (workers == 0 and not chief):
    raise tfc.TFConfigError(
        f"{tasks} Slurm task(s) cannot hold {'a chief, ' if chief else ''}"
        f"{ps} ps and at least one worker")
  jobs = {kind: count for kind, count in (
      (tfc.CHIEF, int(bool(chief))), (tfc.PS, ps), (tfc.WORKER, workers))
          if count}
  # "2(x3),1": at most 2 tasks on a node.
  per_node = max(int(count) for count in re.findall(
      r"(\d+)(?:\(x\d+\))?", os.environ["SLURM_STEP_TASKS_PER_NODE"]))
  # Without GPUs, one "GPU" per task keeps the resolver's arithmetic
  # valid; nothing is assigned (auto_set_gpu=False).
  resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
      jobs=jobs, port_base=port_base,
      gpus_per_node=None if gpus_per_task else per_node,
      gpus_per_task=gpus_per_task or 1, auto_set_gpu=bool(gpus_per_task))
  return tfc.validate({
      "cluster": resolver.cluster_spec().as_dict(),
      "task": {"type": resolver.task_type, "index": resolver.task_id}})


NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
# The label Kubeflow's training operator puts on every pod of a job
# (kubeflow.training.constants.JOB_NAME_LABEL).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"


def tfjob_network_policy(manifest):
  """A Kubernetes NetworkPolicy for `manifest` (a TFJob from
  `tfjob_manifest`): the job's pods admit ingress only from the job's own
  pods, and only on TensorFlow's port. A TensorFlow server runs any graph
  sent to its port; without this, every pod of the cluster reaches it.
  It takes effect where the cluster's network plugin enforces
  NetworkPolicies (Calico, Cilium and most managed clusters' plugins).
  Each container of `manifest` is told so in its environment
  (`ESTIMATOR_ACCUM_PORTS`): `estimator_accum` then writes no firewall of
  its own in the pods, nor a line that their port is open."""
  for spec in manifest["spec"]["tfReplicaSpecs"].values():
    for container in spec["template"]["spec"]["containers"]:
      env = container.setdefault("env", [])
      if not any(item["name"] == closed.CLOSED_BY_ENV for item in env):
        env.append({"name": closed.CLOSED_BY_ENV,
                    "value": "tfjob:networkpolicy"})
  name = manifest["metadata"]["name"]
  namespace = manifest["metadata"].get("namespace", "default")
  job_pods = {"matchLabels": {JOB_NAME_LABEL: name}}
  return {"apiVersion": NETWORK_POLICY_API_VERSION, "kind": "NetworkPolicy",
          "metadata": {"name": f"{name}-tensorflow-port",
                       "namespace": namespace},
          "spec": {"podSelector": job_pods,
                   "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": job_pods}],
                                "ports": [{"protocol": "TCP",
                                           "port": TFJOB_PORT}]}]}}
