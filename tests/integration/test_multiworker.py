"""MultiWorkerMirroredStrategy, 2 worker processes from TF_CONFIG on loopback.

Each worker reads its own shard; the job must equal one device training on
batch 2*k*B (plain TF), at <= 1e-5, with and without clip_norm. The workers
are started and always stopped by `python -m tfconfig launch`.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from harness.multiworker_job import OPTIMIZERS

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

WORKERS, K, MICRO_BATCH, UPDATES = 2, 2, 4, 3
BIG_BATCH = WORKERS * K * MICRO_BATCH
BATCH_NORM_MOMENTUM = 0.5
REFERENCE_OPTIMIZERS = {
    "keras_loss_scale_adam": lambda: tf.keras.optimizers.legacy.Adam(0.05)}


# Under TensorFlow's default Grappler, as users run it: MultiWorkerMirrored-
# Strategy's scoped allocator merges a step's all-reductions (the suite's
# other multi-worker jobs run without Grappler: tests/helpers/grappler.py).
@pytest.mark.estimator
@pytest.mark.grappler
@pytest.mark.parametrize("optimizer_name, clipped, control_flow, pack", [
    # Without clipping once (the optimizers' updates are the same code).
    ("sgd", True, "v2", None), ("momentum", True, "v2", None),
    ("keras_loss_scale_adam", False, "v2", None), ("adam", True, "v2", None),
    ("google_adam_weight_decay", True, "v2", None),
    # Control flow v1, with every tensor its own all-reduce
    # (bytes_per_pack=1; Adam and Momentum under control flow v1 are also
    # in test_mirrored.py, and packs of 1 in the collectives test below).
    ("momentum", True, "v1", 1),
])
def test_two_workers_equal_one_device_big_batch(optimizer_name, clipped,
                                                control_flow, pack, tmp_path):
  data = support.make_data(BIG_BATCH * UPDATES)
  clip_norm = None
  if clipped:
    clip_norm = 0.5 * support.reference_gradient_norm(data, BIG_BATCH)
  # A float32 model under a loss scale trains as its inner optimizer: the
  # scale is a power of 2.
  optimizer_fn = REFERENCE_OPTIMIZERS.get(optimizer_name,
                                          OPTIMIZERS[optimizer_name])
  expected = support.reference_train(
      optimizer_fn, data, BIG_BATCH, UPDATES, clip_norm=clip_norm,
      minimize=optimizer_name in ("sgd", "momentum", "adam"))
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", optimizer_name,
      "--k", str(K), "--micro_batch", str(MICRO_BATCH),
      "--updates", str(UPDATES), "--control_flow", control_flow,
      "--batch_norm_momentum", str(BATCH_NORM_MOMENTUM)]
  if clip_norm is not None:
    command += ["--clip_norm", repr(float(clip_norm))]
  if pack is not None:
    command += ["--bytes_per_pack", str(pack)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert "[worker:0] saved final weights at global step 6" in result.stdout

  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  what = f"{optimizer_name} on {WORKERS} workers, control flow {control_flow}"
  support.assert_weights_moved(actual, what)
  support.assert_weights_close(actual, expected, what=what)
  # The batch_norm layer on the features: its moving statistics are one
  # plain BatchNorm update per big batch, from both workers' examples.
  moving = support.reference_batch_norm(data["x"], [BIG_BATCH] * UPDATES,
                                        BATCH_NORM_MOMENTUM)
  for name, want in zip(["bn/moving_mean", "bn/moving_variance"], moving):
    np.testing.assert_allclose(
        saved[name.replace("/", "__")], want, rtol=1e-5, atol=1e-6,
        err_msg=f"{what}: {name} differs from BatchNorm on the big batches")


def _run_job(tmp_path, optimizer_name, *extra, clip_norm=None):
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", optimizer_name,
      "--k", str(K), "--micro_batch", str(MICRO_BATCH),
      "--updates", str(UPDATES), *extra]
  if clip_norm is not None:
    command += ["--clip_norm", repr(float(clip_norm))]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  saved = np.load(tmp_path / "final_weights.npz")
  return {n: saved[n.replace("/", "__")] for n in support.weight_names()}


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", ["momentum", "adam"])
def test_a_table_sent_by_its_touched_rows_equals_the_big_batch(
    optimizer_name, tmp_path):
  # Momentum moves only the rows a sparse gradient names: a row sent that
  # no worker touched, or one left out, would show.
  data = support.make_data(BIG_BATCH * UPDATES)
  clip_norm = 0.5 * support.reference_gradient_norm(data, BIG_BATCH)
  expected = support.reference_train(
      OPTIMIZERS[optimizer_name], data, BIG_BATCH, UPDATES,
      clip_norm=clip_norm, minimize=True)
  actual = _run_job(tmp_path, optimizer_name, "--table_all_reduce", "rows",
                    clip_norm=clip_norm)
  what = f"{optimizer_name}, table by rows, {WORKERS} workers"
  support.assert_weights_moved(actual, what)
  support.assert_weights_close(actual, expected, what=what)


@pytest.mark.estimator
def test_a_bfloat16_wire_stays_near_the_exact_window(tmp_path):
  # bfloat16 keeps 8 bits of mantissa: each window's gradient is rounded
  # once on the wire (2 workers: one sum), relative error <= 2**-8 per
  # value; Adam's moments carry it on. Measured: 2.8e-3 of the weights'
  # largest movement (Adam, 3 updates); bounded here at 2e-2. Against the
  # exact window, which is the big batch (plain TensorFlow, below; a
  # float32 wire equals it at 1e-5 in the tests above, so no job of its
  # own here).
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES, minimize=True)
  wire = _run_job(tmp_path / "bf16", "adam", "--communication_dtype",
                  "bfloat16", "--table_all_reduce", "rows")
  initial = support.initial_weights()
  moved = max(float(np.max(np.abs(expected[n] - initial[n]))) for n in expected)
  error = max(float(np.max(np.abs(wire[n] - expected[n]))) for n in expected)
  assert 1e-5 * moved < error < 2e-2 * moved, (error, moved)


@pytest.mark.estimator
def test_two_workers_moving_average_after_update(tmp_path):
  """after_update's moving average, updated in cross-replica context on each
  worker, equals the one-device recipe's."""
  decay = 0.9
  data = support.make_data(BIG_BATCH * UPDATES)
  optimizer_fn = OPTIMIZERS["adam"]
  expected = support.reference_train(optimizer_fn, data, BIG_BATCH, UPDATES,
                                     ema_decay=decay)
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(K),
      "--micro_batch", str(MICRO_BATCH), "--updates", str(UPDATES),
      "--ema_decay", str(decay)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in expected}
  averages = [n for n in actual if n.endswith("/ExponentialMovingAverage")]
  assert len(averages) == len(support.weight_names()), sorted(actual)
  for name in averages:
    assert not np.allclose(actual[name], actual[name.rsplit("/", 1)[0]])
  support.assert_weights_close(actual, expected,
                               what=f"moving average on {WORKERS} workers")


# The window all-reduces 7 tensors: 5 gradients, the embedding's touched-row
# mask and the window's micro-batch count (a scalar: the mean divides by it
# in a window that straddles a resume with another k or number of
# replicas); Estimator all-reduces the loss every step.
WINDOW_TENSORS = 7
# Every micro-batch also all-reduces the stop flag, one float32 scalar
# (estimator_accum/distribution/preemption.py): what lets every worker stop
# at one micro-batch on SIGTERM.
STOP_FLAG = 1


@pytest.mark.estimator
@pytest.mark.parametrize("k, pack, collectives_at_window_end", [
    (3, None, 1 + 1 + STOP_FLAG), (1, None, 1 + 1 + STOP_FLAG),
    (3, 1, WINDOW_TENSORS + 1 + STOP_FLAG)])
def test_gradients_cross_workers_only_when_a_window_ends(
    k, pack, collectives_at_window_end, tmp_path):
  """Traced collectives per micro-batch: between window ends only the
  scalars Estimator reports (the loss) and the stop flag cross workers; the gradients travel
  once per window (one round, also with a tf.compat.v1 optimizer, which
  would all-reduce them again itself), and with k=1 on every micro-batch.
  The test model's 10 KB make one pack by default; bytes_per_pack=1 makes
  one all-reduce per tensor, carrying the same bytes."""
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "sgd", "--k", str(k),
      "--micro_batch", str(MICRO_BATCH), "--updates", "2",
      "--count_collectives"]
  if pack is not None:
    command += ["--bytes_per_pack", str(pack)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:]
  for worker in range(WORKERS):
    steps = json.loads((tmp_path / f"collectives_{worker}.json").read_text())
    assert len(steps) == 2 * k
    gradient_bytes = sum(value.size * 4 for value in
                         support.initial_weights().values())
    for step, (count, size, _) in enumerate(steps):
      if (step + 1) % k:
        assert size <= 16, (worker, step, count, size)
      else:
        # One round: the window's sums (plus the embedding's row mask and
        # the loss), not a second one from the optimizer.
        assert gradient_bytes <= size < 1.5 * gradient_bytes, (
            worker, step, count, size, gradient_bytes)
        assert count == collectives_at_window_end, (worker, step, count)


def _summaries(model_dir, tag):
  """{step: value} of a scalar summary in the chief's events files."""
  values = {}
  for path in model_dir.glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = value.simple_value
  return values


@pytest.mark.estimator
@pytest.mark.parametrize("reported", ["this_worker", "across_workers"])
def test_reportable_loss_leaves_the_workers_alone_between_windows(
    reported, tmp_path):
  """Given reportable_loss, Estimator reports each worker's own micro-batch
  loss (the chief's in its summaries) and nothing but the stop flag
  crosses workers between window ends; with across_workers=True, the mean
  over both workers, at one more scalar all-reduce per micro-batch."""
  k, updates = 3, 2
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(k),
      "--micro_batch", str(MICRO_BATCH), "--updates", str(updates),
      "--count_collectives", "--reportable_loss", reported,
      "--record_losses"]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:]
  losses = [json.loads((tmp_path / f"losses_{w}.json").read_text())
            for w in range(WORKERS)]
  assert [len(worker) for worker in losses] == [k * updates] * WORKERS
  # The shards differ, so the two reports can be told apart.
  assert all(abs(a - b) > 1e-3 for a, b in zip(*losses)), losses
  # Summarized at the global step after the micro-batch: 1, 2, ...
  reported_losses = _summaries(tmp_path, "loss")
  assert sorted(reported_losses) == list(range(1, k * updates + 1))
  for step, value in reported_losses.items():
    expected = (losses[0][step - 1] if reported == "this_worker"
                else np.mean([worker[step - 1] for worker in losses]))
    assert value == pytest.approx(expected, rel=1e-6), (step, losses)
  between_windows = STOP_FLAG + (0 if reported == "this_worker" else 1)
  for worker in range(WORKERS):
    steps = json.loads((tmp_path / f"collectives_{worker}.json").read_text())
    for step, (count, size, _) in enumerate(steps):
      if (step + 1) % k:
        assert count == between_windows, (worker, step, count, size)
      else:
        # The window's one pack, and the loss unless it stays local.
        assert count == 1 + between_windows, (worker, step, count, size)


def _where_it_stopped(result, model_dir, lines=25):
  """Each task's last `lines` lines of output, the launcher's lines, and
  the save barriers' markers in `model_dir`."""
  tasks = {}
  for line in result.stdout.splitlines():
    match = re.match(r"\[(\w+:\d+)\] ", line)
    if match and "GRPC" not in line and "ipv4:" not in line:
      tasks.setdefault(match.group(1), []).append(line)
  barrier = model_dir / ".estimator_accum_saves"
  markers = sorted(p.name for p in barrier.iterdir()) if barrier.exists() \
      else []
  return "\n".join([f"exit {result.returncode}", *[
      "\n".join(said[-lines:]) for said in tasks.values()],
      result.stderr[-1500:], f"save barrier markers: {markers}"])


def _adam_job(model_dir, *flags):
  """The launch command of a 2-worker Adam job of harness/multiworker_job.py."""
  return [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(WORKERS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(model_dir), "--optimizer", "adam", "--k", str(K),
      "--micro_batch", str(MICRO_BATCH), "--updates", str(UPDATES), *flags]


@pytest.mark.estimator
def test_a_worker_dies_and_the_restarted_job_resumes_exactly(tmp_path):
  """Worker 1 dies mid-window after micro-batch 3; launch stops worker 0
  and names the task; the same command again resumes from the checkpoint
  of micro-batch 2 and ends equal to the big batch."""
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  command = _adam_job(tmp_path, "--die_at", "3", "--save_every", "2")
  first = subprocess.run(command, capture_output=True, text=True,
                         timeout=300)
  assert first.returncode != 0
  assert "[worker:1] dying after 3 micro-batches" in first.stdout
  assert ("[tfconfig] task worker:1 failed with exit code 3; stopping the "
          "other tasks") in first.stderr, first.stderr[-3000:]
  # Worker 0, inside a micro-batch that waits for worker 1, ends at once:
  # its collective fails and the session it would remake alone is not
  # made (exit 151), or, told to stop first, it sees that worker 1 has
  # exited (its port refuses) rather than after that micro-batch has run
  # 5 s.
  said = first.stdout + first.stderr
  assert re.search(r"\[worker:0\] .*(SIGTERM while not training \(micro-"
                   r"batch \d+ waits on worker:1, which has exited|worker:0: "
                   r"its session failed .*exiting 151)", said), (
                       "\n".join(line for line in said.splitlines()
                                 if "[worker:0]" in line and "WARNING" not in
                                 line)[-3000:])
  second = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert second.returncode == 0, second.stdout[-4000:]
  assert "[worker:0] starting at micro-batch 2" in second.stdout
  assert "[worker:0] saved final weights at global step 6" in second.stdout
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what="restarted job")


def _faulted_adam_job(tmp_path, fault, launch_flags, **env):
  """The 2-worker Adam job with worker 1's `fault` flags, launched with
  `--restart 1` and `launch_flags`, checkpoints every 2 micro-batches;
  returns what it said, after checking that the restarted job resumed
  from micro-batch 2 and ended at the big batch's weights."""
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  command = _adam_job(tmp_path, *fault, "--save_every", "2")
  at = command.index("launch") + 1
  command[at:at] = ["--restart", "1", *launch_flags]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **env))
  said = result.stdout + result.stderr
  assert result.returncode == 0, _where_it_stopped(result, tmp_path)
  assert "[tfconfig] restarting the job (1 of 1)" in said
  assert "[worker:0] starting at micro-batch 2" in said
  assert "[worker:0] saved final weights at global step 6" in said
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what="restarted job")
  return said


@pytest.mark.estimator
def test_a_job_that_stands_still_ends_at_its_bound_and_restarts_exactly(
    tmp_path):
  """Worker 1 sleeps before micro-batch 4, alive and answering; worker 0
  waits in that micro-batch's collective. Past the progress bound (its
  floor set to 8 s here) worker 0 says where it waits and exits 152; the
  launcher stops worker 1 and `--restart 1` resumes the job from the
  checkpoint of micro-batch 2 to the big batch's weights."""
  said = _faulted_adam_job(tmp_path, ["--stall_at", "4"], ["--grace", "5"],
                           ESTIMATOR_ACCUM_PROGRESS_BOUND="8")
  assert "[worker:1] stalling before micro-batch 4" in said
  line = re.search(r"\[worker:0\] \[tfconfig\] worker:0: no progress for "
                   r"(\d+) s: .*bound of (\d+) s.*exiting with 152", said)
  assert line, [text for text in said.splitlines() if "progress" in text]
  # The bound is 20x the job's longest step or save so far, at least the
  # floor: above 8 s where a loaded machine made a step take over 0.4 s.
  assert int(line.group(2)) >= 8 and int(line.group(1)) >= int(line.group(2))
  # Where it waits: inside a session's run, called from Estimator's train.
  assert re.search(r"\[worker:0\] \[tfconfig\]   File .*session.py.* in "
                   r"_call_tf_sessionrun", said), said[-3000:]
  assert ("[tfconfig] task worker:0 failed with exit code 152 (it made no "
          "progress within its bound)") in said


@pytest.mark.estimator
def test_a_session_remade_on_one_worker_ends_the_job_which_restarts_exactly(
    tmp_path):
  """Worker 1's step raises AbortedError (from a hook: what a failed RPC
  raises there) after micro-batch 3. MonitoredSession would close that
  session and make a new one on worker 1 alone while worker 0 waits in
  the old one's collective: every task alive, none moving (it waited until
  the launcher's timeout before). Instead worker 1 exits 151 with one line,
  and `--restart 1` resumes the job from the checkpoint of micro-batch 2
  to the big batch's weights."""
  said = _faulted_adam_job(tmp_path, ["--abort_at", "3"], [],
                           ESTIMATOR_ACCUM_PEER_TIMEOUT="10")
  assert "[worker:1] aborting after 3 micro-batches" in said
  assert re.search(
      r"\[worker:1\] \[tfconfig\] worker:1: its session failed \(AbortedError:"
      r" injected by the test's hook\) and would be made anew on this "
      r"worker alone.*exiting 151", said), said[-3000:]
  assert ("[tfconfig] task worker:1 failed with exit code 151 (its session "
          "failed; the job restarts whole)") in said


@pytest.mark.estimator
@pytest.mark.parametrize("slow_worker, extra", [(0, 0), (1, 0), (0, 1)])
def test_a_job_that_ends_with_its_input_finishes_when_a_worker_is_slower(
    slow_worker, extra, tmp_path):
  """train_and_evaluate on a finite input, no max_steps. One worker's last
  step (the one that finds the input ended) starts 3 s after the other's:
  the other worker's final checkpoint, which reads the window across
  workers, must not start before it (without the save barrier this fails
  every time). With `extra` micro-batches past the last whole window, that
  partial window is not applied: it is kept in the checkpoint, and the
  weights are the big batch's after the whole windows."""
  # The job's data: the whole windows' examples first, as the reference's.
  data = support.make_data(BIG_BATCH * UPDATES + WORKERS * MICRO_BATCH * extra)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  command = _adam_job(tmp_path, "--until_input_ends", "--slow_last_step",
                      str(slow_worker), "--extra_micro_batches", str(extra),
                      "--collectives_before_input")
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  # (It hung once in many runs, until the launcher's timeout: what each
  # task said last, and which save barriers' markers were there, say where.)
  assert result.returncode == 0, _where_it_stopped(result, tmp_path)
  steps = K * UPDATES + extra
  assert f"[worker:0] saved final weights at global step {steps}" in (
      result.stdout)
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what="ended with its input")
  reader = tf.train.load_checkpoint(str(tmp_path))
  held = reader.get_tensor("gradient_accumulation/window_micro_batches")
  assert held == extra * WORKERS, (held, extra)
  # No collective of a micro-batch starts before its input is there: the
  # step that finds the input ended starts none, so none can wait for a
  # worker whose step has ended (the stop flag's all-reduce did, and hung
  # this job once on CI).
  for index in range(WORKERS):
    before_input = json.loads(
        (tmp_path / f"collectives_before_input_{index}.json").read_text())
    assert before_input == [], (index, before_input)


@pytest.mark.estimator
@pytest.mark.parametrize("end", ["stop_hook", "rounds"])
def test_every_way_a_job_ends_finishes_equal_to_the_big_batch(end, tmp_path):
  """A StopAtStepHook instead of max_steps; or train() in rounds that end
  in the middle of a window, with an evaluation between them: each round's
  final checkpoint holds the open window, the next round resumes it."""
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  result = subprocess.run(_adam_job(tmp_path, "--end", end),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert f"[worker:0] saved final weights at global step {K * UPDATES}" in (
      result.stdout)
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what=f"ended by {end}")


@pytest.mark.estimator
def test_a_successful_job_ends_quietly(tmp_path):
  """The chief works 25 s after training (as run_classifier's evaluation):
  the workers leave together, so TensorFlow's coordination service, which
  the chief hosts, logs no error on either (a task that outlived the other
  by a heartbeat logged 'heartbeat timeout' or 'failed to connect to all
  addresses'), and a non-chief's own checkpoint copy is the only extra."""
  result = subprocess.run(
      _adam_job(tmp_path, "--chief_seconds_after", "25"),
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:]
  output = result.stdout + result.stderr
  assert "[worker:0] worker 0 leaves" in output
  assert "[worker:1] worker 1 leaves" in output
  errors = [line for line in output.splitlines()
            if re.search(r"\] E\d{4} |coordination_service", line)]
  assert not errors, errors
