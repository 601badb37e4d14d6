"""The TF_CONFIG each engine sets is accepted, and what we hand the engines
is what they take: a TFJob read by the Kubeflow training SDK's own models,
Slurm tasks' TF_CONFIG from TensorFlow's own SlurmClusterResolver."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml
from kubeflow.training import constants as kubeflow_constants
from kubeflow.training.api_client import ApiClient
from kubeflow.training.models import KubeflowOrgV1TFJob

import tfconfig
from estimator_accum.distribution import watchdog
from tfconfig import engines

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each engine's documented shape (one task of each).
TFJOB = {  # Kubeflow training operator: evaluator in the cluster.
    "cluster": {"chief": ["job-chief-0.ns.svc:2222"],
                "worker": ["job-worker-0.ns.svc:2222",
                           "job-worker-1.ns.svc:2222"],
                "evaluator": ["job-evaluator-0.ns.svc:2222"]},
    "task": {"type": "worker", "index": 1}, "environment": "cloud"}
VOLCANO = {  # Volcano's tensorflow plugin: <job>-<task>-<i>.<job>.
    "cluster": {"worker": ["tf-worker-0.tf:2222", "tf-worker-1.tf:2222"],
                "evaluator": ["tf-evaluator-0.tf:2222"]},
    "task": {"type": "worker", "index": 0}, "environment": "cloud"}
VERTEX_TF_CONFIG = {  # Vertex AI, prebuilt containers.
    "cluster": {"chief": ["cmle-training-chief-0:2222"],
                "worker": ["cmle-training-worker-0:2222"]},
    "task": {"type": "chief", "index": 0, "trial": "1"},
    "environment": "cloud", "job": {"worker_pool_specs": []},
    "cloud": "abc123"}
VERTEX_CLUSTER_SPEC = {  # Vertex AI, custom containers: worker pools.
    "cluster": {"workerpool0": ["cmle-training-workerpool0-0:2222"],
                "workerpool1": ["cmle-training-workerpool1-0:2222",
                                "cmle-training-workerpool1-1:2222"]},
    "environment": "cloud", "task": {"type": "workerpool1", "index": 1}}
AI_PLATFORM_MASTER = {  # AI Platform's older runtimes: master.
    "cluster": {"master": ["master-0:2222"], "worker": ["worker-0:2222"],
                "ps": ["ps-0:2222"]},
    "task": {"type": "master", "index": 0, "cloud": "x"},
    "environment": "cloud", "job": {"scale_tier": "CUSTOM"}}
SAGEMAKER_PS = {  # SageMaker's parameter-server mode (training toolkit).
    "cluster": {"master": ["algo-1:2222"],
                "ps": ["algo-1:2223", "algo-2:2223"],
                "worker": ["algo-2:2222"]},
    "environment": "cloud", "task": {"index": 0, "type": "ps"}}


@pytest.fixture(autouse=True)
def _restore_cluster_variables():
  """use_environment rewrites TF_CONFIG itself: a value left behind would
  make every later Estimator in this process a worker of that cluster."""
  saved = {name: os.environ.get(name) for name in ("TF_CONFIG",
                                                   "CLUSTER_SPEC")}
  yield
  for name, value in saved.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value


def _use(monkeypatch, value, strategy, variable="TF_CONFIG"):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.delenv("CLUSTER_SPEC", raising=False)
  monkeypatch.setenv(variable, json.dumps(value))
  config = tfconfig.use_environment(strategy)
  return config, json.loads(os.environ["TF_CONFIG"])


@pytest.mark.estimator
@pytest.mark.parametrize("value, strategy, expected", [
    (TFJOB, "multi_worker", {
        "cluster": {"chief": TFJOB["cluster"]["chief"],
                    "worker": TFJOB["cluster"]["worker"]},
        "task": {"type": "worker", "index": 1}}),
    (VOLCANO, "multi_worker", {
        "cluster": {"worker": VOLCANO["cluster"]["worker"]},
        "task": {"type": "worker", "index": 0}}),
    (VERTEX_TF_CONFIG, "multi_worker", {
        "cluster": VERTEX_TF_CONFIG["cluster"],
        "task": {"type": "chief", "index": 0}}),
    (AI_PLATFORM_MASTER, "parameter_server", {
        "cluster": {"chief": ["master-0:2222"], "worker": ["worker-0:2222"],
                    "ps": ["ps-0:2222"]},
        "task": {"type": "chief", "index": 0}}),
    (SAGEMAKER_PS, "parameter_server", {
        "cluster": {"chief": ["algo-1:2222"],
                    "ps": ["algo-1:2223", "algo-2:2223"],
                    "worker": ["algo-2:2222"]},
        "task": {"type": "ps", "index": 0}}),
])
def test_engines_tf_config_becomes_tensorflows(value, strategy, expected,
                                               monkeypatch):
  _, written = _use(monkeypatch, value, strategy)
  assert written == expected
  # TensorFlow's own readers take what is written.
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  assert resolver.task_type == expected["task"]["type"]
  assert resolver.task_id == expected["task"]["index"]
  assert resolver.cluster_spec().as_dict() == expected["cluster"]
  if strategy == "parameter_server":
    # Between-graph training: Estimator's RunConfig reads TF_CONFIG itself
    # (under MultiWorkerMirroredStrategy the strategy's resolver does).
    run_config = tf.estimator.RunConfig()
    assert run_config.task_type == expected["task"]["type"]
    assert run_config.is_chief == (expected["task"]["type"] == "chief")
    assert run_config.num_ps_replicas == len(expected["cluster"]["ps"])


def test_vertex_cluster_spec_is_read_without_tf_config(monkeypatch):
  config, written = _use(monkeypatch, VERTEX_CLUSTER_SPEC, "multi_worker",
                         variable="CLUSTER_SPEC")
  assert config["task"] == {"type": "worker", "index": 1}
  assert written == {
      "cluster": {"chief": ["cmle-training-workerpool0-0:2222"],
                  "worker": ["cmle-training-workerpool1-0:2222",
                             "cmle-training-workerpool1-1:2222"]},
      "task": {"type": "worker", "index": 1}}


@pytest.mark.estimator
def test_an_evaluator_listed_in_the_cluster_stays_out_of_training(
    monkeypatch):
  value = dict(TFJOB, task={"type": "evaluator", "index": 0})
  _, written = _use(monkeypatch, value, None)
  assert "evaluator" not in written["cluster"]
  assert tf.estimator.RunConfig().task_type == "evaluator"


@pytest.mark.parametrize("value, strategy, message", [
    (SAGEMAKER_PS, "multi_worker",
     "TF_CONFIG: MultiWorkerMirroredStrategy has no parameter servers, and "
     "the cluster has ps tasks (chief x1, ps x2, worker x1; SageMaker's "
     "parameter-server mode and a TFJob with PS replicas set them): train "
     "with --distribution_strategy=parameter_server, or drop the ps"),
    (VOLCANO, "parameter_server",
     "TF_CONFIG: this job needs a chief, and 'cluster' has none (task types: "
     "worker, evaluator)"),
    ({"cluster": {"master": ["a:1"], "chief": ["b:1"]}}, None,
     "TF_CONFIG: 'cluster' names the chief twice ('chief' and 'chief': "
     "master, chief); give one of them"),
    ({"cluster": {"trainer": ["a:1"]}}, None,
     "TF_CONFIG: unknown task type 'trainer' in 'cluster'; expected one of "
     "chief, worker, ps, evaluator, master, workerpool0, workerpool1, "
     "workerpool2, workerpool3"),
])
def test_a_shape_the_strategy_cannot_use_is_one_line(value, strategy, message,
                                                     monkeypatch):
  with pytest.raises(tfconfig.TFConfigError) as raised:
    _use(monkeypatch, value, strategy)
  assert str(raised.value) == message


# Kubeflow TFJob -------------------------------------------------------------


class _Response:
  """What the SDK's ApiClient.deserialize reads: a body of JSON."""

  def __init__(self, body):
    self.data = json.dumps(body)


def _tfjob(*flags):
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "tfjob", *flags], cwd=ROOT,
      capture_output=True, text=True, check=True)
  documents = list(yaml.safe_load_all(result.stdout))
  assert [d["kind"] for d in documents] == ["TFJob", "NetworkPolicy"]
  return documents[0]


MAIN_JOB = ["--name", "bert-accum", "--image",
            "registry.example/estimator-accum:0.2", "--workers", "4",
            "--pvc", "bert-runs", "--mount_path", "/runs", "--",
            "python", "run_classifier.py", "--distribution_strategy",
            "multi_worker", "--output_dir", "/runs/rotten"]


def _check_admission(job):
  """The training operator's webhook rules for a TFJob."""
  assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job.metadata.name)
  assert len(job.metadata.name) <= 63
  specs = job.spec.tf_replica_specs
  assert sum(specs[t].replicas for t in ("Chief", "Master")
             if t in specs) <= 1
  for replica_type, spec in specs.items():
    assert replica_type.lower() in (
        *kubeflow_constants.TFJOB_REPLICA_TYPES, "evaluator", "master")
    containers = [c for c in spec.template.spec.containers
                  if c.name == kubeflow_constants.TFJOB_CONTAINER]
    assert len(containers) == 1, replica_type
    assert containers[0].image, replica_type
    assert containers[0].ports[0].container_port == 2222


def test_tfjob_of_the_main_job_on_four_workers():
  manifest = _tfjob(*MAIN_JOB)
  job = ApiClient().deserialize(_Response(manifest), "KubeflowOrgV1TFJob")
  assert isinstance(job, KubeflowOrgV1TFJob)
  assert (job.api_version, job.kind) == ("kubeflow.org/v1", "TFJob")
  _check_admission(job)
  worker = job.spec.tf_replica_specs["Worker"]
  assert worker.replicas == 4
  assert worker.restart_policy == "ExitCode"
  assert job.spec.run_policy.backoff_limit == 3
  pod = worker.template.spec
  assert pod.volumes[0].persistent_volume_claim.claim_name == "bert-runs"
  assert pod.containers[0].volume_mounts[0].mount_path == "/runs"
  assert pod.containers[0].command[-2:] == ["--output_dir", "/runs/rotten"]
  # The TF_CONFIG the operator gives each pod is accepted for the job's
  # strategy.
  for index in range(4):
    value = engines.tfjob_tf_config(manifest, "worker", index)
    assert value["cluster"]["worker"][index] == (
        f"bert-accum-worker-{index}.default.svc:2222")
    config = tfconfig.validate(value)
    tfconfig.check_strategy(config, "multi_worker")
    assert tfconfig.tensorflow_form(config)["task"] == {
        "type": "worker", "index": index}


def test_tfjob_comes_with_a_network_policy_for_its_pods_alone():
  """A TensorFlow server runs any graph sent to its port: the NetworkPolicy
  admits to the job's pods only the job's own pods, on TensorFlow's port,
  selected by the label the training operator puts on them."""
  from kubernetes.client import ApiClient as KubernetesClient  # noqa: PLC0415
  from kubernetes.client import V1NetworkPolicy  # noqa: PLC0415

  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "tfjob", *MAIN_JOB[:2],
       "--namespace", "team-a", *MAIN_JOB[2:]],
      cwd=ROOT, capture_output=True, text=True, check=True)
  manifest, policy_doc = yaml.safe_load_all(result.stdout)
  policy = KubernetesClient().deserialize(_Response(policy_doc),
                                          "V1NetworkPolicy")
  assert isinstance(policy, V1NetworkPolicy)
  assert (policy.api_version, policy.kind) == ("networking.k8s.io/v1",
                                               "NetworkPolicy")
  assert policy.metadata.namespace == manifest["metadata"]["namespace"]
  job_pods = {kubeflow_constants.JOB_NAME_LABEL: "bert-accum"}
  assert policy.spec.pod_selector.match_labels == job_pods
  assert policy.spec.policy_types == ["Ingress"]
  [rule] = policy.spec.ingress
  assert [peer.pod_selector.match_labels for peer in rule._from] == [job_pods]
  assert all(peer.namespace_selector is None and peer.ip_block is None
             for peer in rule._from)
  job = ApiClient().deserialize(_Response(manifest), "KubeflowOrgV1TFJob")
  port = job.spec.tf_replica_specs["Worker"].template.spec.containers[0].ports[0]
  assert [(p.protocol, p.port) for p in rule.ports] == [
      ("TCP", port.container_port)]
  # The pods are told their port is closed by the policy, so that
  # estimator_accum's import writes no firewall and no line of its own.
  env = job.spec.tf_replica_specs["Worker"].template.spec.containers[0].env
  assert ("ESTIMATOR_ACCUM_PORTS", "tfjob:networkpolicy") in [
      (item.name, item.value) for item in env]
  alone = subprocess.run(
      [sys.executable, "-m", "tfconfig", "tfjob", "--no_network_policy",
       *MAIN_JOB], cwd=ROOT, capture_output=True, text=True, check=True)
  [lone] = yaml.safe_load_all(alone.stdout)
  assert lone["kind"] == "TFJob"
  lone_env = lone["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
      "containers"][0]["env"]
  assert "ESTIMATOR_ACCUM_PORTS" not in [item["name"] for item in lone_env]


def test_tfjob_with_every_replica_type():
  manifest = _tfjob("--name", "ps-job", "--image", "img", "--chief",
                    "--workers", "2", "--ps", "1", "--evaluator",
                    "--restart_policy", "OnFailure", "--", "python",
                    "train.py")
  job = ApiClient().deserialize(_Response(manifest), "KubeflowOrgV1TFJob")
  _check_admission(job)
  assert sorted(job.spec.tf_replica_specs) == ["Chief", "Evaluator", "PS",
                                               "Worker"]
  for replica_type in ("chief", "worker", "ps", "evaluator"):
    value = engines.tfjob_tf_config(manifest, replica_type, 0)
    config = tfconfig.validate(value)
    if replica_type != "evaluator":
      tfconfig.check_strategy(config, "parameter_server")
    assert "evaluator" not in tfconfig.tensorflow_form(config)["cluster"]


@pytest.mark.parametrize("grace", [None, 90])
def test_tfjob_pods_stop_within_their_grace_period(grace, monkeypatch):
  """Every pod's terminationGracePeriodSeconds, and the stop's bound 10 s
  inside it in every container, read by the SDK's models (the pod spec is
  Kubernetes' V1PodSpec) and by the library as it reads it."""
  flags = ["--grace_seconds", str(grace)] if grace else []
  manifest = _tfjob("--name", "ps-job", "--image", "img", "--chief",
                    "--workers", "2", "--ps", "1", *flags, "--", "python",
                    "train.py")
  job = ApiClient().deserialize(_Response(manifest), "KubeflowOrgV1TFJob")
  expected = grace or 30
  for replica_type, spec in job.spec.tf_replica_specs.items():
    pod = spec.template.spec
    assert pod.termination_grace_period_seconds == expected, replica_type
    (env,) = [e for e in pod.containers[0].env
              if e.name == "ESTIMATOR_ACCUM_STOP_SECONDS"]
    monkeypatch.setenv(env.name, env.value)
    assert watchdog.seconds_from_environment(env.name, None) == expected - 10


@pytest.mark.parametrize("flags, message", [
    (["--name", "j", "--image", "i", "--grace_seconds", "14", "--", "x"],
     "--grace_seconds must be a whole number of seconds >= 15"),
    (["--name", "Bert_Job", "--image", "i", "--", "x"],
     "--name 'Bert_Job' is not a DNS-1035 label"),
    (["--name", "j", "--image", "", "--", "x"], "--image is required"),
    (["--name", "j", "--image", "i", "--pvc", "c", "--", "x"],
     "--pvc and --mount_path go together"),
    (["--name", "j", "--image", "i"], "tfjob needs a command after --"),
])
def test_tfjob_refuses_what_the_operator_would(flags, message):
  result = subprocess.run([sys.executable, "-m", "tfconfig", "tfjob", *flags],
                          cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 2
  assert message in result.stderr, result.stderr
  assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("arguments, message", [
    (dict(command="python train.py"), "command must be a non-empty list of "
     "str (the program and its arguments, a container's command), got "
     "'python train.py'"),
    (dict(command=[]), "command must be a non-empty list of str"),
    (dict(command=["python", 3]), "command must be a non-empty list of str"),
    (dict(workers=-1, chief=True), "--workers must be a whole number >= 0, "
     "got -1"),
    (dict(ps=1.5, chief=True), "--ps must be a whole number >= 0, got 1.5"),
    (dict(backoff_limit=-2), "--backoff_limit must be a whole number >= 0"),
])
def test_tfjob_manifest_refuses_a_bad_argument_in_one_line(arguments,
                                                           message):
  # A command given as one string was split into one argument per character.
  given = dict(name="job", image="image", command=["python", "train.py"],
               workers=2)
  given.update(arguments)
  with pytest.raises(tfconfig.TFConfigError) as raised:
    engines.tfjob_manifest(**given)
  assert str(raised.value).startswith(message), str(raised.value)


# Slurm ----------------------------------------------------------------------

SLURM = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[01-02]",
         "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77"}


def _slurm(rank, *flags, command=("python", "train.py")):
  env = dict(os.environ, SLURM_PROCID=str(rank), **SLURM)
  env.pop("TF_CONFIG", None)
  return subprocess.run(
      [sys.executable, "-m", "tfconfig", "slurm", *flags, "--", *command],
      cwd=ROOT, env=env, capture_output=True, text=True)


def test_slurm_tasks_get_the_resolvers_cluster():
  configs = [json.loads(_slurm(rank, "--print_only").stdout)
             for rank in range(4)]
  expected_cluster = {"worker": ["node01:8888", "node01:8889",
                                 "node02:8888", "node02:8889"]}
  for rank, config in enumerate(configs):
    assert config == {"cluster": expected_cluster,
                      "task": {"type": "worker", "index": rank}}


def test_slurm_parameter_server_job_and_the_command_runs_with_it():
  ps_job = json.loads(_slurm(1, "--chief", "--ps", "1",
                             "--print_only").stdout)
  assert ps_job["cluster"] == {"chief": ["node01:8888"],
                               "ps": ["node01:8889"],
                               "worker": ["node02:8888", "node02:8889"]}
  assert ps_job["task"] == {"type": "ps", "index": 0}
  result = _slurm(3, command=(
      sys.executable, "-c",
      "import json, os; print(json.loads(os.environ['TF_CONFIG'])['task'])"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "{'type': 'worker', 'index': 3}"
  assert "[tfconfig] slurm rank 3: worker:3 of 4" in result.stderr


def test_slurm_outside_srun_is_one_line():
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "slurm", "--", "python", "x.py"],
      cwd=ROOT, env=env, capture_output=True, text=True)
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "error: not a Slurm task: SLURM_PROCID, "
      "SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE "
      "not set (run it under srun)")
