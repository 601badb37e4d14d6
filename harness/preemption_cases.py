"""SIGTERM to a running harness/multiworker_job.py, for real: the cases of
tests/integration/test_preemption.py and benchmarks/preemption.py (2
MultiWorkerMirroredStrategy workers on loopback through `tfconfig launch`,
or one process: MirroredStrategy's two replicas, or no strategy). Each case returns what happened: the
exit code, the seconds from the signal to the exit, the step each task
agreed to stop at and the step of the newest complete checkpoint.

The parameter-server cases (`PS_CASES`) run harness/ps_job.py instead: a
chief, a worker and a ps, SIGTERM to every task or to the ps alone."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from harness import hosts, support

STOPPED = 128 + int(signal.SIGTERM)
# one_process: MirroredStrategy, two replicas on two logical CPUs;
# during_save: one process without a strategy.
CASES = ("all_tasks", "one_task", "during_all_reduce", "during_save",
         "one_process")
STRATEGIES = ("multi_worker", "mirrored", "none")
# SIGTERM to every task of a parameter-server job; to its ps alone.
PS_CASES = ("parameter_server", "parameter_server_ps_alone")
PS_TASKS = ("chief:0", "worker:0")
PS_REPEAT = 20


def job(model_dir, updates, *extra, strategy="multi_worker"):
  """The command of the job: through the launcher for 2 workers."""
  flags = hosts.job_flags(model_dir, updates, "--strategy", strategy, *extra,
                          peer_timeout=0)
  if strategy != "multi_worker":
    return flags
  return [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
          "--timeout", "600", "--", *flags]


def environment(**values):
  return dict(os.environ, ESTIMATOR_ACCUM_PEER_TIMEOUT="8", **values)


def final_weights(model_dir):
  saved = np.load(os.path.join(model_dir, "final_weights.npz"))
  return {n: saved[n.replace("/", "__")]
          for n in support.weight_names() + ["global_step"]}


def run_to_end(model_dir, updates, strategy="multi_worker", env=None):
  """Runs the job to its end; returns its output (asserting exit 0)."""
  done = subprocess.run(job(model_dir, updates, strategy=strategy),
                        cwd=hosts.ROOT, capture_output=True, text=True,
                        timeout=600, env=env or environment())
  output = done.stdout + done.stderr
  assert done.returncode == 0, output[-3000:]
  return output


def stop_steps(output):
  """[the global step each stopped task agreed on]."""
  return [int(s) for s in re.findall(
      r"stopping \([^)]*\) at global step (\d+)", output)]


def wait_for_output(run, text, seconds=60, count=1):
  """Waits until a `hosts.Run`'s output shows `text` `count` times
  (asserting it runs)."""
  deadline = time.monotonic() + seconds
  while run.output().count(text) < count:
    assert run.process.poll() is None and time.monotonic() < deadline, (
        run.output()[-3000:])
    time.sleep(0.02)


def _exit(run, started, seconds):
  try:
    code = run.wait(seconds)
  except subprocess.TimeoutExpired:
    code = None  # still running: a row of the "before" table
  return code, time.monotonic() - started


def run_case(case, model_dir, tmp_path, updates, env=None, wait=60,
             step_seconds=0.05):
  """Runs the job in `model_dir`, stops it as `case` says, and returns
  {code, seconds, stop_steps, checkpoint_step, output}; the job's
  processes are gone when it returns (code None: it had not exited
  within `wait` s)."""
  strategy = {"during_save": "none", "one_process": "mirrored"}.get(
      case, "multi_worker")
  extra = ["--step_seconds", str(step_seconds)]
  if case == "during_save":
    # A 1 GB variable beside the model: a save takes seconds (2.3 s here);
    # no periodic save after step 0's, so that the stop's save is one.
    extra += ["--save_every", "100000", "--ballast_mb", "1024"]
  run = hosts.Run(job(model_dir, updates, *extra, strategy=strategy),
                  tmp_path, case, env=env or environment())
  frozen = []
  try:
    hosts.wait_for_step(model_dir, 0, [run.process])
    time.sleep(2.0)
    started = time.monotonic()
    if case in ("all_tasks", "one_process"):
      run.process.send_signal(signal.SIGTERM)
    elif case == "one_task":
      hosts.signal_all(hosts.task_pids(run.process.pid, 1), signal.SIGTERM)
    elif case == "during_all_reduce":
      # Worker 1 frozen: worker 0 waits inside a step's collective when
      # SIGTERM reaches both; worker 1 goes on, the collective completes.
      frozen = hosts.task_pids(run.process.pid, 1)
      hosts.signal_all(frozen, signal.SIGSTOP)
      time.sleep(1.0)
      started = time.monotonic()
      hosts.signal_all(frozen + hosts.task_pids(run.process.pid, 0),
                       signal.SIGTERM)
      time.sleep(0.5)
      hosts.signal_all(frozen, signal.SIGCONT)
    elif case == "during_save":
      # The second SIGTERM lands inside the stop's save.
      run.process.send_signal(signal.SIGTERM)
      if env is None or env.get("ESTIMATOR_ACCUM_STOP_ON_SIGTERM") != "0":
        # (Not "at global step": TensorFlow's "...that global step has not
        # been increased" warning matched it, before the stop's line.)
        wait_for_output(run, "stopping (SIGTERM) at global step", 30)
        time.sleep(0.3)
      run.process.send_signal(signal.SIGTERM)
    code, seconds = _exit(run, started, wait)
  finally:
    hosts.signal_all(frozen, signal.SIGCONT)
    run.kill()
  output = run.output()
  return dict(code=code, seconds=seconds, stop_steps=stop_steps(output),
              checkpoint_step=hosts.latest_step(model_dir), output=output,
              strategy=strategy)


def run_startup_case(phase, model_dir, tmp_path, strategy="multi_worker",
                     wait=60, first_task_lag=0.0):
  """Starts the job, SIGTERMs every task (not the launcher: as Slurm's
  scancel and Kubernetes do) once each says it reached `phase` of its
  start (harness/multiworker_job.py PHASES; it waits there until the
  signals are sent, then all go on together), and returns
  {code, seconds, codes: [each task's exit code], output}. `phase`
  "ps_imported" runs the parameter-server job instead. `first_task_lag`:
  task 0 goes on that many seconds after the others."""
  release = os.path.join(tmp_path, "release")
  if phase == "ps_imported":
    command = ps_job(model_dir, "a") + ["--pause_at_start", "10"]
    tasks = [("chief", 0), ("worker", 0), ("ps", 0)]
    phase = "imported"
  else:
    # Every task waits there until the file exists (10 s at most): made
    # once each is signalled, so that they go on together.
    command = job(model_dir, 4, "--pause_at", phase, "--pause_seconds",
                  "10", "--release_file", str(release), "--step_seconds",
                  "0.05", "--first_task_lag", str(first_task_lag),
                  strategy=strategy)
    tasks = [("worker", 0), ("worker", 1)] if strategy == "multi_worker" \
        else []
  run = hosts.Run(command, tmp_path, phase, env=environment())
  signalled = max(len(tasks), 1)
  try:
    wait_for_output(run, f"phase {phase}\n", 120, count=signalled)
    started = time.monotonic()
    if tasks:
      pids = [p for kind, index in tasks
              for p in hosts.task_pids(run.process.pid, index, kind)]
      assert len(pids) == len(tasks), pids
      hosts.signal_all(pids, signal.SIGTERM)
    else:
      run.process.send_signal(signal.SIGTERM)
    # Released once each task has taken the signal (its line, said after
    # the stop is asked), or the job has ended.
    deadline = time.monotonic() + 30
    while (run.output().count("[estimator_accum] SIGTERM") < signalled and
           run.process.poll() is None and time.monotonic() < deadline):
      time.sleep(0.02)
    with open(release, "w"):
      pass
    code, seconds = _exit(run, started, wait)
  finally:
    run.kill()
  output = run.output()
  return dict(code=code, seconds=seconds, output=output,
              checkpoint_step=hosts.latest_step(model_dir))


def resume(model_dir, updates, strategy="multi_worker", env=None):
  """Starts the job again on `model_dir`: (the micro-batch it went on
  from, its final weights)."""
  output = run_to_end(model_dir, updates, strategy, env)
  started = re.search(r"starting at micro-batch (\d+)", output)
  return int(started.group(1)), final_weights(model_dir)


def largest_difference(weights, reference):
  return max(float(np.max(np.abs(weights[n] - reference[n])))
             for n in reference)


# The parameter-server job: harness/ps_job.py (chief 1, worker 10: each
# window a task completes subtracts its constant from the shared w).

def ps_job(model_dir, run, step_seconds=0.0):
  return [sys.executable, "-m", "tfconfig", "launch", "--chief", "--workers",
          "1", "--ps", "1", "--timeout", "300", "--", sys.executable,
          "harness/ps_job.py", "--model_dir", str(model_dir), "--repeat",
          str(PS_REPEAT), "--run", run, "--step_seconds", str(step_seconds)]


def ps_progress(model_dir, task):
  """The micro-batches `task` has completed (its progress file)."""
  try:
    with open(os.path.join(model_dir, f"progress_{task}.json")) as reader:
      return json.load(reader)["micro_batches"]
  except (OSError, ValueError):
    return 0


def checkpoint_value(model_dir, name):
  import tensorflow as tf

  return tf.train.load_checkpoint(str(model_dir)).get_tensor(name)


def ps_windows(table):
  """{task: the windows of it that `table` (ps_job's) holds}: each task's
  window moves its own row by its constant."""
  from harness.ps_job import PLAN, ROWS

  return {t: float(-table[ROWS[t]][0] / PLAN[t][0]) + 0.0 for t in PS_TASKS}


def run_ps_case(case, model_dir, tmp_path, env=None, wait=60,
                step_seconds=0.05):
  """Runs the parameter-server job, stops it as `case` says; returns
  {code, seconds, stop_steps, checkpoint_step, counts (the micro-batches
  each training task completed), output}."""
  run = hosts.Run(ps_job(model_dir, "a", step_seconds), tmp_path, case,
                  env=env or environment())
  try:
    deadline = time.monotonic() + 120
    while min(ps_progress(model_dir, t) for t in PS_TASKS) < 10:
      assert run.process.poll() is None and time.monotonic() < deadline, (
          run.output()[-3000:])
      time.sleep(0.05)
    started = time.monotonic()
    if case == "parameter_server":
      run.process.send_signal(signal.SIGTERM)
    else:
      hosts.signal_all(hosts.task_pids(run.process.pid, 0, "ps"),
                       signal.SIGTERM)
    code, seconds = _exit(run, started, wait)
  finally:
    run.kill()
  output = run.output()
  return dict(code=code, seconds=seconds, stop_steps=stop_steps(output),
              checkpoint_step=hosts.latest_step(model_dir), output=output,
              counts={t: ps_progress(model_dir, t) for t in PS_TASKS})


def resume_ps(model_dir):
  """Starts the job again on `model_dir`, to its end: its final.json."""
  os.remove(os.path.join(model_dir, "chief_ready"))
  done = subprocess.run(ps_job(model_dir, "b"), cwd=hosts.ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=environment())
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  with open(os.path.join(model_dir, "final.json")) as reader:
    return json.load(reader)
