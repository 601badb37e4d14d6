"""run_classifier.py's --effective_batch_size / --micro_batch_size flags on
the tiny BERT: the plan it measures, prints and keeps, its one-line errors,
and that the split does not change the weights."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from models.bert import convert_hf
from tests.helpers import bert_fixtures
from tests.integration import test_run_classifier as base

# Whole jobs, processes or clusters: not the fast tier. The tests that
# measure peaks are marked memory; those that only train a given split or
# pass a plan on are not (the suite runs them without Grappler:
# tests/helpers/grappler.py).
pytestmark = pytest.mark.slow

_flags, _run = base._flags, base._run
# The tiny BERT and the SST-2 files, as fixtures here too.
tiny_model, sst2 = base.tiny_model, base.sst2


def _plan_flags(model, data, output_dir, **extra):
  flags = _flags(model, data, output_dir, **extra)
  # The split comes from the plan flags, not --train_batch_size and k.
  return [f for f in flags if not f.startswith(
      ("--train_batch_size=", "--gradient_accumulation_multiplier="))]


@pytest.mark.estimator
@pytest.mark.memory
def test_auto_measures_prints_and_keeps_its_plan(tiny_model, sst2, tmp_path):
  output_dir = tmp_path / "run"
  result = _run(_plan_flags(tiny_model, sst2, output_dir,
                            effective_batch_size=8, micro_batch_size="auto",
                            memory_budget_mb=4000, do_eval=False))
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "measuring the largest micro-batch whose peak fits 4000 MB" in out
  assert re.search(r"micro-batch plan on CPU:0: budget 4000.0 MB, margin "
                   r"10%", out), out
  assert re.search(r"micro-batch +8 \(k=1\): peak .* MB, fits .*<- chosen",
                   out), out
  assert "effective batch 8 = 1 worker(s) x 1 replica(s) x micro-batch 8 x " \
         "k=1; 10 updates (10 micro-batches)" in out
  plan = json.loads((output_dir / "micro_batch_plan.json").read_text())
  assert (plan["micro_batch"], plan["k"], plan["budget_bytes"]) == (
      8, 1, 4000 * 2**20)
  assert plan["measurements"][0]["peak_bytes"] > 0
  assert tf.train.load_checkpoint(str(output_dir)).get_tensor(
      "global_step") == 10
  # A rerun in the directory keeps the plan instead of measuring again.
  again = _run(_plan_flags(tiny_model, sst2, output_dir,
                           effective_batch_size=8, micro_batch_size="auto",
                           memory_budget_mb=1, do_eval=False))
  assert again.returncode == 0, again.stderr[-3000:]
  assert "measuring" not in again.stdout
  assert f"plan from {output_dir}/micro_batch_plan.json" in again.stdout


@pytest.mark.estimator
def test_the_split_does_not_change_the_weights(tiny_model, sst2, tmp_path):
  # Dropout on: keyed by example (the default), any split meets the same
  # masks.
  model = tiny_model
  common = dict(do_eval=False, effective_batch_size=8)
  weights = {}
  for micro_batch in (8, 2):
    output_dir = tmp_path / f"micro{micro_batch}"
    result = _run(_plan_flags(model, sst2, output_dir,
                              micro_batch_size=micro_batch, **common))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"micro-batch {micro_batch} x k={8 // micro_batch}; 10 updates"
            in result.stdout), result.stdout
    weights[micro_batch] = tf.train.load_checkpoint(str(output_dir))
  names = [n for n in weights[8].get_variable_to_shape_map()
           if n.startswith(("bert/", "output_")) and "adam" not in n.lower()]
  assert len(names) > 10
  start = tf.train.load_checkpoint(str(tiny_model / "bert_model.ckpt"))
  moved = 0
  for name in names:
    np.testing.assert_allclose(weights[2].get_tensor(name),
                               weights[8].get_tensor(name), rtol=1e-5,
                               atol=1e-6, err_msg=name)
    if start.has_tensor(name):
      moved += not np.allclose(start.get_tensor(name),
                               weights[8].get_tensor(name))
  assert moved > 10, "training did not move the weights"


@pytest.mark.estimator
@pytest.mark.memory
def test_fastest_times_the_splits_that_fit_and_trains_the_same_weights(
    tiny_model, sst2, tmp_path):
  # Dropout on (keyed by example, the default): the fastest split trains to
  # the weights of any other.
  model = tiny_model
  common = dict(do_eval=False, effective_batch_size=8)
  fastest_dir = tmp_path / "fastest"
  cache = tmp_path / "plan_cache"
  env = dict(os.environ, ESTIMATOR_ACCUM_PLAN_CACHE=str(cache))
  result = _run(_plan_flags(model, sst2, fastest_dir,
                            micro_batch_size="fastest", memory_budget_mb=4000,
                            **common), env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "then timing whole windows of the splits that fit" in out, out
  timed_lines = re.findall(r"measured micro-batch (\d+) \(k=(\d+)\): "
                           r"window ([\d.]+) s timed", out)
  assert [int(m) for m, _, _ in timed_lines][:2] == [8, 4], out
  assert all(int(m) * int(k) == 8 for m, k, _ in timed_lines), out
  plan = estimator_accum.MicroBatchPlan.read(
      str(fastest_dir / "micro_batch_plan.json"))
  timed = {m.micro_batch: m.window_seconds for m in plan.measurements
           if m.window_seconds is not None}
  assert sorted(timed) == sorted(int(m) for m, _, _ in timed_lines), plan
  # The plan is the shortest window timed (a smaller split only when 3%
  # shorter than every larger one).
  assert timed[plan.micro_batch] <= 1.04 * min(timed.values()), timed
  assert all(timed[m] >= 0.97 * timed[plan.micro_batch]
             for m in timed if m > plan.micro_batch), timed
  assert re.search(rf"chose micro-batch {plan.micro_batch} x k={plan.k}: "
                   r"the fastest window timed that fits", out), out
  assert (f"micro-batch {plan.micro_batch} x k={plan.k}; 10 updates" in out)
  given_dir = tmp_path / "given"
  other = 8 if plan.micro_batch != 8 else 2
  given = _run(_plan_flags(model, sst2, given_dir, micro_batch_size=other,
                           **common))
  assert given.returncode == 0, given.stderr[-3000:]
  trained = [tf.train.load_checkpoint(str(d)) for d in (fastest_dir,
                                                          given_dir)]
  names = [n for n in trained[0].get_variable_to_shape_map()
           if n.startswith(("bert/", "output_")) and "adam" not in n.lower()]
  assert len(names) > 10
  for name in names:
    np.testing.assert_allclose(
        trained[0].get_tensor(name), trained[1].get_tensor(name), rtol=1e-5,
        atol=1e-6, err_msg=f"{name}: {plan.micro_batch} x {plan.k} against "
        f"{other} x {8 // other}")
  _a_new_directory_reads_the_plan_cache(model, sst2, tmp_path, cache, env,
                                        plan, common)


def _a_new_directory_reads_the_plan_cache(model, sst2, tmp_path, cache, env,
                                          plan, common):
  """The fastest plan above went to the plan cache: a run in a new
  directory with the same flags reads it."""
  entries = sorted(cache.glob("*.json"))
  assert len(entries) == 1, entries
  entry = json.loads(entries[0].read_text())
  assert entry["plan"]["micro_batch"] == plan.micro_batch
  assert entry["key"]["signature"]["flags"]["max_seq_length"] == 16, entry

  def run(name, **extra):
    flags = dict(common, micro_batch_size="fastest", memory_budget_mb=4000,
                 num_train_epochs=0.2)
    flags.update(extra)
    done = _run(_plan_flags(model, sst2, tmp_path / name, **flags), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout

  out = run("cached")
  assert "measuring" not in out, out
  assert (f"plan from the plan cache {entries[0]} (timed before for this "
          f"model, step flags, training data, budget, TensorFlow and device;"
          f" --noplan_cache times again): effective batch 8 = 1 replica(s) "
          f"x micro-batch {plan.micro_batch} x k={plan.k}") in out, out
  written = json.loads((tmp_path / "cached" / "micro_batch_plan.json")
                       .read_text())
  assert written["micro_batch"] == plan.micro_batch
  # (What else keys the cache, --noplan_cache, and a cache file cut
  # short: tests/unit/models/test_batch_plan_cache.py.)


@pytest.mark.estimator
@pytest.mark.memory
@pytest.mark.parametrize("extra, message", [
    (dict(micro_batch_size="auto", effective_batch_size=8),
     r"--memory_budget_mb=None on CPU:0: give the budget in MB"),
    (dict(micro_batch_size="auto", memory_budget_mb=0.001),
     r"--memory_budget_mb=0.001: even micro-batch 1 needs .* MB, over"),
    (dict(micro_batch_size=3, effective_batch_size=8),
     r"--micro_batch_size=3 does not divide the 8 examples per replica"),
    (dict(micro_batch_size="lots"), r"--micro_batch_size=lots: must be "
     r"'auto', 'fastest' or a positive whole number"),
    (dict(micro_batch_size="fastest", effective_batch_size=8),
     r"--memory_budget_mb=None on CPU:0: give the budget in MB"),
    (dict(effective_batch_size=8), r"--effective_batch_size=8 needs "
     r"--micro_batch_size"),
    (dict(micro_batch_size=4, train_batch_size=4),
     r"--micro_batch_size=4 and --train_batch_size both set the micro-batch"),
])
def test_bad_plan_flags_are_one_line(extra, message, tiny_model, sst2,
                                     tmp_path):
  flags = _plan_flags(tiny_model, sst2, tmp_path / "run", **extra)
  if "train_batch_size" in extra:
    flags.append(f"--train_batch_size={extra['train_batch_size']}")
  result = _run(flags)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines()
            if "error" in line.lower()]
  assert errors and re.search(message, errors[0]), result.stderr[-2000:]


@pytest.mark.estimator
def test_a_rerun_with_another_batch_is_refused(tiny_model, sst2, tmp_path):
  output_dir = tmp_path / "run"
  first = _run(_plan_flags(tiny_model, sst2, output_dir, micro_batch_size=4,
                           effective_batch_size=8, num_train_epochs=0.5,
                           do_eval=False))
  assert first.returncode == 0, first.stderr[-3000:]
  second = _run(_plan_flags(tiny_model, sst2, output_dir, micro_batch_size=2,
                            effective_batch_size=8, do_eval=False))
  assert second.returncode != 0
  assert re.search(r"micro_batch_plan.json holds a run of effective batch 8 "
                   r"= 1 replica\(s\) x micro-batch 4 x k=2: resume it with "
                   r"the same batch flags", second.stderr), second.stderr


@pytest.mark.estimator
def test_two_workers_train_the_chiefs_plan(tiny_model, sst2, tmp_path):
  # (Not marked memory: the plan under test is the one the chief sends,
  # whatever its peak; the suite runs it without Grappler, as its other
  # multi-worker jobs: 2 x 8 s of CPU less.)
  output_dir = tmp_path / "run"
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
             "--timeout", str(base.TIMEOUT), "--", sys.executable,
             "run_classifier.py", *_plan_flags(
                 tiny_model, sst2, output_dir, effective_batch_size=16,
                 micro_batch_size="auto", memory_budget_mb=4000,
                 distribution_strategy="multi_worker", do_eval=False)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=base.TIMEOUT + 30)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  # Each worker takes 8 of the 16 examples per update; the chief measures.
  assert "[worker:0] measured micro-batch 8 (k=1)" in result.stdout
  assert "[worker:1] measured" not in result.stdout
  assert "[worker:1] using the chief's plan" in result.stdout or (
      "[worker:1] plan from" in result.stdout), result.stdout
  for worker in (0, 1):
    assert (f"[worker:{worker}] effective batch 16 = 2 worker(s) x 1 "
            "replica(s) x micro-batch 8 x k=1; 5 updates (5 micro-batches)"
            ) in result.stdout, result.stdout
  assert tf.train.load_checkpoint(str(output_dir)).get_tensor(
      "global_step") == 5


def _long_sentences(data):
  """32 training snippets of 140 words (one window): every batch is 128
  tokens long."""
  rng = np.random.RandomState(0)
  words = "the film was great fun a very good movie dull bad acting".split()
  rows = "".join(f"{' '.join(rng.choice(words, 140))}\t{i % 2}\n"
                 for i in range(32))
  data.mkdir()
  (data / "train.tsv").write_text("sentence\tlabel\n" + rows)


def _trained_peak_mb(result):
  found = re.search(r"peak tensor memory ([\d,]+) MB on CPU:0", result.stdout)
  assert found, result.stdout[-2000:]
  return float(found.group(1).replace(",", ""))


def _planned_run(common, directory, micro_batch):
  """The script on a plan of `micro_batch` x k written in its run directory
  (as if planned there before), without a memory limit."""
  directory.mkdir()
  estimator_accum.MicroBatchPlan.given(32, micro_batch).write(
      str(directory / "micro_batch_plan.json"))
  result = _run(common + [f"--output_dir={directory}"])
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
  """A random BERT whose activations at 128 tokens outweigh its state
  (hidden 64, 2 layers of 4 heads, intermediate 256), as a long input's do
  on a large model: its peak grows with the micro-batch. (MiniLM, the
  default model, took 3 runs of 35 s here for the same finding.)"""
  root = tmp_path_factory.mktemp("long_bert")
  bert_fixtures.write_tiny_hf_bert(str(root / "hf"), hidden=64, layers=2,
                                   heads=4, intermediate=256, positions=128)
  convert_hf.convert(str(root / "hf"), str(root / "ckpt"))
  return root / "ckpt"


@pytest.mark.estimator
@pytest.mark.memory
def test_running_out_of_memory_halves_the_plan_and_trains_it(long_model,
                                                             tmp_path):
  """A BERT with a plan of 16 x 2 in the run directory (as if it fit when
  planned), on a CPU allocator limited to between what micro-batch 8 and 16
  hold: the first step runs out of memory, the run goes on at
  8 x 4 from its first checkpoint and ends where a run planned at 8 x 4
  from the start ends. The limit comes from the two plans' own peaks,
  trained on this CPU first: BERT's peaks differ between oneDNN's kernels
  and Eigen's, and the planner's two small points (2 and 8) are no guide to
  16's."""
  _long_sentences(tmp_path / "data")
  common = ["--task_name=sst-2", f"--data_dir={tmp_path / 'data'}",
            f"--bert_config_file={long_model / 'bert_config.json'}",
            f"--vocab_file={long_model / 'vocab.txt'}",
            f"--init_checkpoint={long_model / 'bert_model.ckpt'}",
            "--max_seq_length=128",
            "--effective_batch_size=32", "--micro_batch_size=auto",
            "--do_eval=false", "--num_train_epochs=1",
            "--memory_budget_mb=100000"]
  planned = tmp_path / "planned"
  peak_8 = _trained_peak_mb(_planned_run(common, planned, 8))
  peak_16 = _trained_peak_mb(_planned_run(common, tmp_path / "at_16", 16))
  assert peak_16 > 1.5 * peak_8, (peak_8, peak_16)
  # Halfway: 8 runs with room to spare for the halving's checkpoint write
  # after the failed step, and 16 does not fit.
  limit_mb = int((peak_8 + peak_16) / 2)
  measured = {8: peak_8, 16: peak_16}

  halved = tmp_path / "halved"
  halved.mkdir()
  estimator_accum.MicroBatchPlan.given(32, 16).write(
      str(halved / "micro_batch_plan.json"))
  result = _run(common + [f"--output_dir={halved}"], env=dict(
      os.environ, TF_CPU_ALLOCATOR_USE_BFC="true",
      TF_CPU_BFC_MEM_LIMIT_IN_MB=str(limit_mb)))
  assert result.returncode == 0, (limit_mb, measured,
                                  result.stderr[-3000:])
  assert ("out of memory at micro-batch 16 x k=2: going on with micro-batch "
          "8 x k=4 from the checkpoint at micro-batch 0 (micro-batch 0 of "
          "the new plan); the effective batch stays 32") in result.stdout, (
              limit_mb, measured, result.stdout[-2000:])
  plan = json.loads((halved / "micro_batch_plan.json").read_text())
  assert (plan["micro_batch"], plan["k"], plan["halvings"]) == (8, 4, 1)

  expected = tf.train.load_checkpoint(str(planned))
  actual = tf.train.load_checkpoint(str(halved))
  assert actual.get_tensor("global_step") == 4 == expected.get_tensor(
      "global_step")
  for name in expected.get_variable_to_shape_map():
    if name.startswith(("bert/", "output_")) and "adam" not in name.lower():
      np.testing.assert_allclose(actual.get_tensor(name),
                                 expected.get_tensor(name), rtol=1e-5,
                                 atol=1e-6, err_msg=name)
