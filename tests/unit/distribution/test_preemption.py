"""The stop on SIGTERM (estimator_accum/distribution/preemption.py) in one
graph: the micro-batch after the signal changes no state and ends the run
as the end of input does (OutOfRangeError), a second SIGTERM ends the
process at once, and it is off when asked. The
signals are real, sent to a fresh process (the stop exits its process)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.distribution import stop_requests
from harness import support
from tests.helpers import one_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    import numpy as np
    import tensorflow as tf
    import estimator_accum
    from estimator_accum.distribution import preemption
    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.get_variable("w", initializer=np.ones([3], np.float32))
    loss = tf.reduce_sum(tf.square(x * tf.random.uniform([3])))
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.AdamOptimizer(0.1), 4, summaries=False)
    # A Saver in the graph, as Estimator's: the exit waits for its save.
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS,
                                   tf.compat.v1.train.Saver())
    state = [v for v in tf.compat.v1.global_variables()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(train_op)
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.5)
      # The next micro-batch agrees on the stop (and trains); the one after
      # it raises, changing nothing.
      raised, runs = None, 0
      while raised is None and runs < 3:
        before = session.run(state)
        runs += 1
        try:
          session.run(train_op)
        except tf.errors.OutOfRangeError as error:
          raised = error.message
      after = session.run(state)
      same = all(np.array_equal(a, b) for a, b in zip(before, after))
      print("RESULT " + json.dumps(dict(raised=raised, same=same, runs=runs,
                                        state=len(state))), flush=True)
      if len(sys.argv) > 1:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
      os._exit(0)
""")


def _run(*argv, **env):
  return subprocess.run([sys.executable, "-c", _SCRIPT, *argv], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, ESTIMATOR_ACCUM_STOP_SECONDS="60",
                                 **env))


def _result(done):
  line = next((li for li in done.stdout.splitlines()
               if li.startswith("RESULT ")), None)
  assert line, done.stdout[-2000:] + done.stderr[-3000:]
  return json.loads(line[len("RESULT "):])


def test_the_micro_batch_after_sigterm_changes_nothing_and_ends_the_run():
  done = _run()
  result = _result(done)
  assert done.returncode == 0, done.stderr[-3000:]
  assert result["runs"] == 2
  assert "stopped before micro-batch 7" in result["raised"]
  assert result["same"] and result["state"] > 3
  assert "SIGTERM: stopping" in done.stderr
  assert "stopping (SIGTERM) at global step 7" in done.stderr


def test_a_second_sigterm_ends_the_process_at_once():
  done = _run("again")
  assert _result(done)["raised"]
  assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
  assert "a second SIGTERM: exiting now" in done.stderr


def test_off_when_asked():
  done = _run(ESTIMATOR_ACCUM_STOP_ON_SIGTERM="0")
  # TensorFlow's own handling: SIGTERM ends the process.
  assert done.returncode == -signal.SIGTERM
  assert "RESULT" not in done.stdout


# SIGTERM before training: from `import estimator_accum` on, whatever
# TensorFlow installs when a MultiWorkerMirroredStrategy is made (its
# coordination service's handler, which only records the signal).
_STARTUP = textwrap.dedent("""
    import os, signal, sys, time
    case = sys.argv[1]
    import tensorflow as tf
    import estimator_accum
    from estimator_accum.distribution import stop_signals
    if case == "imported":
      print("ready", flush=True)
      time.sleep(30)
    if case == "recorded":
      # Nothing takes the signal back until the train op is built.
      stop_signals._DISPLACED_POLL_SECONDS = 3600
      time.sleep(0.2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if case == "strategy":
      time.sleep(1.0)  # 50 looks at the handler
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(30)
    os.kill(os.getpid(), signal.SIGTERM)  # TensorFlow's handler has it
    time.sleep(1.5)
    print("still running", flush=True)
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
      estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(w * w), tf.compat.v1.train.AdamOptimizer(0.1), 2,
          summaries=False)
    time.sleep(30)
""")


def _startup(case):
  process = subprocess.Popen(
      [sys.executable, "-c", _STARTUP, case], cwd=ROOT, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1",
               TF_CONFIG=one_worker.tf_config()))
  try:
    if case == "imported":
      assert process.stdout.readline() == "ready\n"
      process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
  finally:
    process.kill()
  return process.returncode, out, err


def test_sigterm_after_the_import_exits_at_once():
  code, _, err = _startup("imported")
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert "SIGTERM before training began (no micro-batch has run in this " \
         "process): nothing to save; exiting with 143" in err


def test_two_threads_that_find_the_stop_done_say_so_once():
  """The stop's thread and the main thread (at its end) can both find the
  stop's save complete: one last line, one exit. Each caller here takes
  0.5 s over its line; before, both lines came out (a task's last line
  twice, seen with forked test tasks)."""
  script = textwrap.dedent("""
      import threading, time
      from estimator_accum.distribution import stop_state
      say = stop_state.say
      def slow_say(line):
          say(line)
          time.sleep(0.5)
      stop_state.say = slow_say
      start = threading.Barrier(2)
      def finish(name):
          start.wait()
          stop_state.exit_now(f"stopped: {name}")
      threads = [threading.Thread(target=finish, args=(name,))
                 for name in ("the stop's thread", "the main thread")]
      for thread in threads:
          thread.start()
      for thread in threads:
          thread.join()
      """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=60, cwd=ROOT,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert done.returncode == 143, done.stderr[-2000:]
  assert len(re.findall(r"\[estimator_accum\] stopped: ", done.stderr)) == 1, (
      done.stderr[-2000:])


@pytest.mark.slow  # a process making a MultiWorkerMirroredStrategy
def test_the_handler_a_strategy_displaces_is_taken_back():
  # Before: the coordination service's handler recorded the signal and
  # nothing else happened until SIGKILL.
  code, _, err = _startup("strategy")
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert "SIGTERM before training began" in err
  assert "SIGTERM caught" not in err  # TensorFlow's handler never ran


@pytest.mark.slow  # a process making a MultiWorkerMirroredStrategy
def test_a_sigterm_tensorflows_handler_recorded_is_acted_on():
  code, out, err = _startup("recorded")
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert "SIGTERM caught" in err  # TensorFlow's handler had it
  assert "still running" in out
  assert re.search(r"SIGTERM recorded by TensorFlow's coordination service "
                   r"\(on /job:worker/task:0\) before this process took the "
                   r"signal back: acting on it", err), err[-3000:]
  assert "SIGTERM before training began" in err


def _train_op_ops(build):
  with tf.Graph().as_default() as graph:
    build()
    return {op.type for op in graph.get_operations()}, graph


def _build_graph_op():
  w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
  estimator_accum.build_accumulating_train_op(
      tf.reduce_sum(w * w, name="loss"),
      tf.compat.v1.train.GradientDescentOptimizer(0.1), 2, summaries=False)


def test_every_gradient_the_loss_and_the_flag_wait_for_the_stop_check(
    monkeypatch):
  monkeypatch.setenv("ESTIMATOR_ACCUM_STOP_ON_SIGTERM", "1")
  _, graph = _train_op_ops(_build_graph_op)
  check = [op for op in graph.get_operations()
           if op.name.endswith("stop_check")]
  assert len(check) == 1
  adds = [op for op in graph.get_operations()
          if op.type in ("AssignAddVariableOp", "AssignAdd")]
  loss = graph.get_operation_by_name("loss")
  flag = [op for op in graph.get_operations() if op.name.endswith("stop_flag")]
  assert adds and all(support.depends_on(op, check)
                      for op in adds + [loss] + flag)


def test_no_check_when_off(monkeypatch):
  monkeypatch.setenv("ESTIMATOR_ACCUM_STOP_ON_SIGTERM", "0")
  _, graph = _train_op_ops(_build_graph_op)
  assert not [op for op in graph.get_operations() if "stop_" in op.name]


def test_a_bad_stop_seconds_is_refused_at_the_build(monkeypatch):
  monkeypatch.setenv("ESTIMATOR_ACCUM_STOP_SECONDS", "soon")
  try:
    _train_op_ops(_build_graph_op)
  except ValueError as error:
    assert "ESTIMATOR_ACCUM_STOP_SECONDS" in str(error) and "soon" in str(
        error)
  else:
    raise AssertionError("ESTIMATOR_ACCUM_STOP_SECONDS=soon was accepted")


# A parameter-server job's stop requests (stop_requests.py), through real
# servers: a chief and a ps on loopback, in a process of their own (a
# TensorFlow server cannot be stopped; it goes with its process).
_REQUESTS_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys, time
    import tensorflow as tf
    from estimator_accum.distribution import stop_requests

    def free_port():
      with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

    def config(cluster, task_type):
      return {"cluster": cluster, "task": {"type": task_type, "index": 0}}

    cluster = {"chief": [f"127.0.0.1:{free_port()}"],
               "ps": [f"127.0.0.1:{free_port()}"]}
    servers = [tf.distribute.Server(tf.train.ClusterSpec(cluster),
                                    job_name=job, task_index=0)
               for job in ("chief", "ps")]
    result = {}
    with tf.Graph().as_default():
      requests = stop_requests.read()
      result["device"] = requests.device
      with tf.compat.v1.Session(servers[0].target) as session:
        result["before"] = int(session.run(requests))
        result["chief_posts"] = stop_requests.post(config(cluster, "chief"))
        result["after_chief"] = int(session.run(requests))
        # A parameter server asks through its own server.
        result["ps_posts"] = stop_requests.post(config(cluster, "ps"))
        result["after_ps"] = int(session.run(requests))
    # Nothing listens on the ps of this one: an error line, in bounded time.
    gone = {"chief": [f"127.0.0.1:{free_port()}"],
            "ps": [f"127.0.0.1:{free_port()}"]}
    tf.distribute.Server(tf.train.ClusterSpec(gone), job_name="chief",
                         task_index=0)
    started = time.monotonic()
    result["gone"] = stop_requests.post(config(gone, "chief"),
                                        timeout_seconds=2)
    result["gone_seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)
""")


def test_stop_requests_go_through_ps_task_0():
  done = subprocess.run([sys.executable, "-c", _REQUESTS_SCRIPT], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  result = _result(done)
  assert result["device"] == "/job:ps/task:0"
  assert result["before"] == 0  # nobody asked yet
  assert result["chief_posts"] is None and result["after_chief"] == 1
  assert result["ps_posts"] is None and result["after_ps"] == 2
  assert result["gone"] and "\n" not in result["gone"], result["gone"]
  assert result["gone_seconds"] < 30


def _tf_config(cluster, task_type):
  return {"cluster": cluster, "task": {"type": task_type, "index": 0}}


def test_which_tasks_of_a_parameter_server_job_save_and_serve(monkeypatch):
  cluster = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
  monkeypatch.setenv("TF_CONFIG", json.dumps(_tf_config(cluster, "chief")))
  assert stop_requests.training_config() is not None
  assert stop_requests.serving_config() is None
  assert stop_requests.saves_checkpoints()
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      _tf_config(dict(cluster, worker=["127.0.0.1:3"]), "worker")))
  assert not stop_requests.saves_checkpoints()  # the chief saves
  monkeypatch.setenv("TF_CONFIG", json.dumps(_tf_config(cluster, "ps")))
  assert stop_requests.serving_config() is not None
  assert stop_requests.training_config() is None


def test_no_stop_requests_outside_a_parameter_server_job(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps(_tf_config(
      {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker")))
  assert stop_requests.training_config() is None
  assert stop_requests.saves_checkpoints()
  monkeypatch.delenv("TF_CONFIG")
  assert stop_requests.training_config() is None
  _, graph = _train_op_ops(_build_graph_op)
  assert not [op for op in graph.get_operations()
              if "stop_requests" in op.name]


# A parameter server takes SIGTERM when estimator_accum is imported there.
_PS_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys, time

    def free_port():
      with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

    # The chief's address answers nothing: it has exited.
    cluster = {"chief": [f"127.0.0.1:{free_port()}"],
               "ps": [f"127.0.0.1:{free_port()}"]}
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "ps", "index": 0}})
    import tensorflow as tf
    import estimator_accum  # noqa: F401 (takes SIGTERM on a ps)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster),
                                  job_name="ps", task_index=0)
    print("SERVING", flush=True)
    server.join()
""")


@pytest.mark.parametrize("seconds", [None, "soon"])
def test_a_parameter_server_told_to_stop_exits_once_training_is_gone(
    seconds):
  env = dict(os.environ)
  env.pop("ESTIMATOR_ACCUM_STOP_SECONDS", None)
  if seconds:
    env["ESTIMATOR_ACCUM_STOP_SECONDS"] = seconds
  process = subprocess.Popen([sys.executable, "-c", _PS_SCRIPT], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
  try:
    assert process.stdout.readline().strip() == "SERVING"
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=30)
    err = process.stderr.read()
  finally:
    process.kill()
    process.wait()
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert "SIGTERM on a parameter server" in err, err[-3000:]
  assert "stopped: every training task has exited" in err, err[-3000:]
  if seconds:
    assert "ESTIMATOR_ACCUM_STOP_SECONDS must be a number of seconds" in err
