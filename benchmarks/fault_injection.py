"""Kills a 2-worker job at random micro-batches, resumes it, checks the end.

A MultiWorkerMirroredStrategy job (`harness/multiworker_job.py`: k=2, Adam,
checkpoints every 2 micro-batches) is launched with `python -m tfconfig
launch`; once it has trained past its last resume point, a random worker
is sent SIGKILL at a random moment. The launcher stops the other worker and
fails; the same command is run again and resumes from the last checkpoint.
After `--kills` kills the job runs to its end, and its final weights are
compared with the same job run without interruption, and with plain
TensorFlow training on the big batch:

    python benchmarks/fault_injection.py --kills 4 --seed 0

Exits non-zero unless every kill was resumed, the weights equal the
uninterrupted job's, and the big batch's within rtol 1e-5, atol 1e-6.
"""

import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from harness import bench, support  # noqa: E402
from harness.multiworker_job import OPTIMIZERS  # noqa: E402

WORKERS, K, MICRO_BATCH, UPDATES = 2, 2, 4, 30


def _latest_step(model_dir):
  steps = [int(name.split("-")[1].split(".")[0])
           for name in os.listdir(model_dir)
           if name.startswith("model.ckpt-") and name.endswith(".index")]
  return max(steps, default=0)


def _worker_pids(model_dir):
  """The workers' pids (not the launcher's, whose command names theirs)."""
  found = subprocess.run(["pgrep", "-f", f"multiworker_job.py --model_dir "
                          f"{model_dir} "], capture_output=True, text=True)
  pids = []
  for pid in found.stdout.split():
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"tfconfig" not in f.read():
          pids.append(int(pid))
    except FileNotFoundError:
      pass
  return pids


def _launch(model_dir):
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers",
             str(WORKERS), "--timeout", "300", "--", sys.executable,
             os.path.join(ROOT, "harness", "multiworker_job.py"), "--model_dir",
             model_dir, "--optimizer", "adam", "--k", str(K), "--micro_batch",
             str(MICRO_BATCH), "--updates", str(UPDATES), "--save_every", "2",
             "--step_seconds", "0.05"]
  return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def _kill_once(model_dir, rng):
  """Runs the job until a random worker is killed past its resume point;
  returns (killed, micro-batch of the latest checkpoint, launcher's code)."""
  resumed_at = _latest_step(model_dir)
  launcher = _launch(model_dir)
  while _latest_step(model_dir) <= resumed_at and launcher.poll() is None:
    time.sleep(0.02)
  time.sleep(rng.uniform(0.0, 0.5))
  pids = _worker_pids(model_dir)
  killed = launcher.poll() is None and bool(pids)
  if killed:
    os.kill(rng.choice(pids), signal.SIGKILL)
  code = launcher.wait()
  return killed, resumed_at, code


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--kills", type=int, default=4)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  data = support.make_data(WORKERS * K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data,
                                     WORKERS * K * MICRO_BATCH, UPDATES)
  runs = kills = resumes = 0
  rows = bench.Rows("2 workers, MWMS, k=4, Adam: a worker killed (SIGKILL), "
                    "the job launched again", args.json, markdown=True)
  with tempfile.TemporaryDirectory() as model_dir:
    while kills < args.kills:
      killed, resumed_at, code = _kill_once(model_dir, rng)
      runs += 1
      resumes += resumed_at > 0
      if not killed:
        break
      kills += 1
      rows.add(run=runs, **{"from micro-batch": resumed_at,
                            "worker killed after checkpoint":
                                _latest_step(model_dir),
                            "launch exit code": code})
    resumed_at = _latest_step(model_dir)
    final = _launch(model_dir).wait()
    runs += 1
    resumes += resumed_at > 0
    rows.add(run=runs, **{"from micro-batch": resumed_at,
                          "worker killed after checkpoint": "(to the end)",
                          "launch exit code": final})
    killed_weights = _final_weights(model_dir)
  with tempfile.TemporaryDirectory() as model_dir:
    whole = _launch(model_dir).wait()
    whole_weights = _final_weights(model_dir)
  from_whole = max(float(np.max(np.abs(killed_weights[n] - whole_weights[n])))
                   for n in expected)
  close = all(np.allclose(killed_weights[n], expected[n], rtol=1e-5,
                          atol=1e-6) for n in expected)
  from_big = max(float(np.max(np.abs(killed_weights[n] - expected[n])))
                 for n in expected)
  ok = (final == 0 and whole == 0 and kills == args.kills and
        from_whole == 0.0 and close)
  print(f"{runs} runs, {kills} kills, {resumes} resumes; largest weight "
        f"difference from the uninterrupted 2-worker job: {from_whole:.1e}; "
        f"from plain big-batch training: {from_big:.1e} (within rtol 1e-5, "
        f"atol 1e-6: {close}) -> {'ok' if ok else 'FAILED'}", flush=True)
  if not ok:
    rows.fail("the resumed job differs from the uninterrupted one, or a "
              "launch failed")
  return rows.exit_code()


def _final_weights(model_dir):
  saved = np.load(os.path.join(model_dir, "final_weights.npz"))
  return {n: saved[n.replace("/", "__")] for n in support.weight_names()}


if __name__ == "__main__":
  sys.exit(main())
