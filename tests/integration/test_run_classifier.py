"""run_classifier.py end to end on a tiny random BERT and tiny SST-2 files:
train + eval + predict with k=2, one-line errors for bad input, and a
2-worker TF_CONFIG job through `python -m tfconfig launch`."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.checkpoints import integrity
from models.bert import convert_hf
from tests.helpers import bert_fixtures

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

POSITIVE = ["the film was great fun", "a very good movie", "great acting",
            "the plot is good and fun", "a fun , fun film !"]
NEGATIVE = ["the film was dull", "a very bad movie", "awful acting",
            "the plot is dull and bad", "not good , not fun ."]
TIMEOUT = 240


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  # One encoder layer: what these tests check (flags, windows, workers,
  # resumes, errors) is the same on one layer as on two, and each run of
  # the script costs a quarter less CPU (graph building is most of it).
  # A test that needs depth (recomputation) makes its own.
  return _tiny_bert(tmp_path_factory.mktemp("tiny_bert"), layers=1)


def _tiny_bert(root, layers):
  bert_fixtures.write_tiny_hf_bert(str(root / "hf"), layers=layers)
  convert_hf.convert(str(root / "hf"), str(root / "ckpt"))
  return root / "ckpt"


def _write_sst2(data):
  data.mkdir()
  rows = [(t, 1) for t in POSITIVE] + [(t, 0) for t in NEGATIVE]
  body = "".join(f"{text}\t{label}\n" for text, label in rows)
  (data / "train.tsv").write_text("sentence\tlabel\n" + body * 4)
  (data / "dev.tsv").write_text("sentence\tlabel\n" + body)
  (data / "test.tsv").write_text("index\tsentence\n" + "".join(
      f"{i}\t{text}\n" for i, (text, _) in enumerate(rows)))
  return data


@pytest.fixture
def sst2(tmp_path):
  return _write_sst2(tmp_path / "data")


@pytest.fixture(scope="module")
def main_run(tiny_model, tmp_path_factory):
  """(result, output_dir) of one train + eval + predict run with k=2, with
  google-research/bert's TPU flags off as its README's GPU commands pass
  them: the tests that only read a whole run's output share it."""
  root = tmp_path_factory.mktemp("main_run")
  output_dir = root / "run"
  result = _run(_flags(tiny_model, _write_sst2(root / "data"), output_dir,
                       do_predict=True, use_tpu=False,
                       iterations_per_loop=1000, master="local",
                       trace_window=True))
  return result, output_dir


def _write_mrpc(data):
  """MRPC-format train and dev files (sentence pairs) in `data`."""
  for split in ("train", "dev"):
    (data / f"{split}.tsv").write_text(
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" +
        "1\t1\t2\ta good film\ta fine film\n"
        "0\t3\t4\ta dull film\ta great film\n" * 4)


def _flags(model, data, output_dir, **extra):
  flags = {"task_name": "sst-2", "data_dir": data,
           "bert_config_file": model / "bert_config.json",
           "vocab_file": model / "vocab.txt",
           "init_checkpoint": model / "bert_model.ckpt",
           "output_dir": output_dir, "max_seq_length": 16,
           "train_batch_size": 4, "gradient_accumulation_multiplier": 2,
           "num_train_epochs": 2, "learning_rate": 1e-3,
           "eval_batch_size": 3, "predict_batch_size": 3, "log_every": 2}
  flags.update(extra)
  return [f"--{name}={value}" for name, value in flags.items()]


def _run(args, timeout=TIMEOUT, env=None):
  return subprocess.run([sys.executable, "run_classifier.py", *args],
                        capture_output=True, text=True, timeout=timeout,
                        env=env)


def _assert_summaries_at_the_first_step(output_dir):
  """TensorBoard's scalars of a 20-micro-batch run, written by
  EveryStepSummaryHook at the first step (every 100 after it)."""
  tags = {}
  for path in output_dir.glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append(event.step)
  assert tags["learning_rate"] == [1] and tags["loss"] == [1], tags
  assert tags["accumulation/updates_applied"] == [1], tags


@pytest.mark.estimator
def test_train_eval_predict_with_accumulation(tiny_model, main_run):
  result, output_dir = main_run
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("--master, --iterations_per_loop: TPU flags, not used without "
          "--use_tpu") in result.stderr
  # 40 examples x 2 epochs / (1 x 1 x 4 x 2) = 10 updates, 20 micro-batches.
  assert ("effective batch 8 = 1 worker(s) x 1 replica(s) x micro-batch 4 x "
          "k=2; 10 updates (20 micro-batches)") in result.stdout
  assert re.search(r"micro-batch 20/20 \(100%\) \| update 10 \(k=2\)",
                   result.stderr)
  # --trace_window: window 4 of 10 traced, said in a line, a Chrome trace.
  assert re.search(r"window trace: the window before, untraced: 2 "
                   r"micro-batches in \d+ ms; traced: \d+ ms, .*matmuls \d+%",
                   result.stderr), result.stderr[-3000:]
  trace = json.loads((output_dir / "window_trace.json").read_text())
  assert {event["pid"] for event in trace["traceEvents"]} == {0, 1}
  # Its schedule counts updates and its optimizer computes no gradients of
  # its own: none of the library's warnings about those.
  assert "computed from global_step" not in result.stderr
  assert "overrides compute_gradients" not in result.stderr
  reader = tf.train.load_checkpoint(str(output_dir))
  assert reader.get_tensor("global_step") == 20
  _assert_summaries_at_the_first_step(output_dir)
  start = tf.train.load_checkpoint(str(tiny_model / "bert_model.ckpt"))
  name = "bert/encoder/layer_0/attention/self/query/kernel"
  assert not np.allclose(reader.get_tensor(name), start.get_tensor(name))
  results = dict(line.split(" = ") for line in (
      output_dir / "eval_results.txt").read_text().splitlines())
  assert 0.0 <= float(results["eval_accuracy"]) <= 1.0
  assert results["num_examples"] == "10"
  rows = (output_dir / "test_results.tsv").read_text().splitlines()
  assert len(rows) == 10
  for row in rows:
    probabilities = [float(value) for value in row.split("\t")]
    assert len(probabilities) == 2
    assert abs(sum(probabilities) - 1.0) < 1e-4


@pytest.mark.estimator
def test_the_dev_split_sorted_by_length_gives_the_same_metrics(
    tiny_model, main_run, tmp_path):
  # main_run evaluated its 10 dev examples sorted by length (the default),
  # 64 batches of 3 at a time; the same checkpoint evaluated in the file's
  # order: the same accuracy, the mean loss up to float32's summation order.
  _, output_dir = main_run
  copy = tmp_path / "run"
  shutil.copytree(output_dir, copy)
  (copy / "eval_results.txt").unlink()
  result = _run(_flags(tiny_model, output_dir.parent / "data", copy,
                       do_train=False, sort_eval_by_length=False))
  assert result.returncode == 0, result.stderr[-3000:]

  def metrics(directory):
    return {key: float(value) for key, value in (
        line.split(" = ") for line in (
            directory / "eval_results.txt").read_text().splitlines())}

  sorted_, plain = metrics(output_dir), metrics(copy)
  assert sorted_["eval_accuracy"] == plain["eval_accuracy"]
  assert sorted_["num_examples"] == plain["num_examples"] == 10
  np.testing.assert_allclose(sorted_["eval_loss"], plain["eval_loss"],
                             rtol=1e-6)


@pytest.mark.estimator
def test_use_fp16_trains_with_a_dynamic_loss_scale(tiny_model, sst2,
                                                   tmp_path):
  output_dir = tmp_path / "run"
  # k under the name Hugging Face's scripts give it (k=4, the default,
  # would make 5 updates).
  flags = _flags(tiny_model, sst2, output_dir, use_fp16=True)
  flags[flags.index("--gradient_accumulation_multiplier=2")] = (
      "--gradient_accumulation_steps=2")
  result = _run(flags)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "k=2; 10 updates (20 micro-batches)" in result.stdout
  reader = tf.train.load_checkpoint(str(output_dir))
  assert reader.get_tensor("global_step") == 20
  assert reader.get_tensor("gradient_accumulation/loss_scale") >= 2.0 ** 10
  assert reader.get_tensor("gradient_accumulation/updates_applied") >= 9
  name = "bert/encoder/layer_0/attention/self/query/kernel"
  assert reader.get_variable_to_dtype_map()[name] == tf.float32
  assert "eval_accuracy" in (output_dir / "eval_results.txt").read_text()


@pytest.mark.estimator
@pytest.mark.parametrize("change, message", [
    ("missing_file", "has no train.tsv"),
    ("malformed_row", r"train.tsv:3: expected at least 2 tab-separated"),
    ("bad_label", r"dev.tsv:2: label 'maybe' is not one of \['0', '1'\]"),
    ("long_sequence", r"--max_seq_length=65 is above the model's "
                      r"max_position_embeddings \(64\)"),
    ("cased", r"--do_lower_case=False but vocab_file .* is an uncased"),
    ("k0", r"gradient_accumulation_multiplier.*0"),
    ("tpu", r"--use_tpu=true: .* has no TPU support"),
    ("tf_config", r"TF_CONFIG: worker:1 address 'localhost' has no port"),
    ("output_is_a_file", r"--output_dir=.*/run is a file, not a directory"),
    ("output_not_writable", r"--output_dir=.*/blocker/run is not writable"),
    ("non_utf8", r"train.tsv:3: byte b'\\xff' is not UTF-8"),
    ("nul_byte", r"train.tsv:2: a NUL byte"),
    ("huge_k", r"gradient_accumulation_multiplier.*16777216"),
    ("pair_too_long", r"--max_seq_length=4 cannot hold a sentence pair"),
    ("xla_auto_jit", r"TF_XLA_FLAGS='--tf_xla_auto_jit=1 "
                     r"--tf_xla_cpu_global_jit' clusters the training graph"),
])
def test_bad_input_gets_one_line_and_nonzero_exit(change, message,
                                                  tiny_model, sst2, tmp_path):
  extra = {}
  if change == "missing_file":
    os.remove(sst2 / "train.tsv")
  elif change == "malformed_row":
    (sst2 / "train.tsv").write_text(
        "sentence\tlabel\ngood fun\t1\na line without its label\n")
  elif change == "bad_label":
    (sst2 / "dev.tsv").write_text("sentence\tlabel\ngood\tmaybe\n")
    extra["do_train"] = False
  elif change == "long_sequence":
    extra["max_seq_length"] = 65
  elif change == "cased":
    extra["do_lower_case"] = False
  elif change == "k0":
    extra["gradient_accumulation_multiplier"] = 0
  elif change == "tpu":
    extra["use_tpu"] = True
  elif change == "output_is_a_file":
    (tmp_path / "run").write_text("not a directory")
  elif change == "output_not_writable":
    (tmp_path / "blocker").write_text("a file where a directory must go")
    extra["output_dir"] = tmp_path / "blocker" / "run"
  elif change == "non_utf8":
    (sst2 / "train.tsv").write_bytes(
        b"sentence\tlabel\ngood fun\t1\ncaf\xff bad\t0\n")
  elif change == "nul_byte":
    (sst2 / "train.tsv").write_bytes(b"sentence\tlabel\ngood\0fun\t1\n")
  elif change == "huge_k":
    extra["gradient_accumulation_multiplier"] = 2**70
  elif change == "pair_too_long":
    _write_mrpc(sst2)
    extra.update(task_name="mrpc", max_seq_length=4)
  env = None
  if change == "xla_auto_jit":  # (it aborted the process at the first step)
    env = dict(os.environ,
               TF_XLA_FLAGS="--tf_xla_auto_jit=1 --tf_xla_cpu_global_jit")
  if change == "tf_config":
    extra["distribution_strategy"] = "multi_worker"
    env = dict(os.environ, TF_CONFIG=json.dumps({
        "cluster": {"worker": ["localhost:2222", "localhost"]},
        "task": {"type": "worker", "index": 0}}))
  output_dir = extra.pop("output_dir", tmp_path / "run")
  result = _run(_flags(tiny_model, sst2, output_dir, **extra), env=env)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines()
            if "error" in line.lower()]
  assert errors and re.search(message, errors[0]), result.stderr[-2000:]
  if change not in ("output_is_a_file", "output_not_writable"):
    assert not (tmp_path / "run").exists(), "a failed start left its dir"


def _two_workers(model, data, output_dir, **extra):
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
             "--timeout", str(TIMEOUT), "--", sys.executable,
             "run_classifier.py", *_flags(
                 model, data, output_dir,
                 distribution_strategy="multi_worker", **extra)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=TIMEOUT + 30)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result


@pytest.mark.estimator
def test_two_workers_train_with_the_effective_batch_they_print(
    tiny_model, sst2, tmp_path):
  # Dropout off: the windows sorted by length (the default), packed into
  # rows (--pack_windows) and as the input gives them, each worker
  # arranging its own share, end at the same weights.
  model = _no_dropout_model(tiny_model, tmp_path)
  output_dir = tmp_path / "run"
  result = _two_workers(model, sst2, output_dir, classifier_dropout=0)
  # 40 x 2 / (2 workers x 1 replica x 4 x k=2) = 5 updates, 10 micro-batches.
  for worker in (0, 1):
    assert (f"[worker:{worker}] effective batch 16 = 2 worker(s) x 1 "
            f"replica(s) x micro-batch 4 x k=2; 5 updates (10 micro-batches)"
            ) in result.stdout
    assert (f"[worker:{worker}] each window's 2 x 4 examples sorted by "
            "length") in result.stdout
  assert tf.train.load_checkpoint(str(output_dir)).get_tensor(
      "global_step") == 10
  assert "[worker:0] eval on 10 held-out examples" in result.stdout
  assert (output_dir / "eval_results.txt").exists()
  weights = {"sorted": tf.train.load_checkpoint(str(output_dir))}
  for arrangement, extra in (("packed", dict(pack_windows=True)),
                             ("plain", dict(sort_windows_by_length=False,
                                            unpadded=False,
                                            pooled_only=False))):
    done = _two_workers(model, sst2, tmp_path / arrangement, do_eval=False,
                        classifier_dropout=0, **extra)
    packed_line = "[worker:1] each window's 2 x 4 examples packed into rows"
    assert (packed_line in done.stdout) == (arrangement == "packed")
    weights[arrangement] = tf.train.load_checkpoint(
        str(tmp_path / arrangement))
  assert_arrangements_trained_alike(weights, tiny_model)


def assert_arrangements_trained_alike(weights, tiny_model):
  """weights: {"sorted", "packed", "plain": checkpoint readers} of runs of
  10 micro-batches. The plain run's weights moved from the tiny model's,
  and the sorted and packed runs end at them (1e-5)."""
  names = [n for n in weights["plain"].get_variable_to_shape_map()
           if n.startswith(("bert/", "output_")) and "adam" not in n.lower()]
  start = tf.train.load_checkpoint(str(tiny_model / "bert_model.ckpt"))
  assert sum(not np.allclose(start.get_tensor(n),
                             weights["plain"].get_tensor(n))
             for n in names if start.has_tensor(n)) > 10
  for arrangement in ("sorted", "packed"):
    assert weights[arrangement].get_tensor("global_step") == 10
    for name in names:
      np.testing.assert_allclose(weights[arrangement].get_tensor(name),
                                 weights["plain"].get_tensor(name), rtol=1e-5,
                                 atol=1e-6, err_msg=f"{arrangement}: {name}")


# Each trainer arranges its own windows: sorted by length (the default),
# or packed into rows (the window weighted by the examples it holds).
@pytest.mark.estimator
@pytest.mark.parametrize("arrangement", ["sorted", "packed"])
def test_parameter_server_job_trains_each_workers_windows(
    arrangement, tiny_model, sst2, tmp_path):
  output_dir = tmp_path / "run"
  command = [sys.executable, "-m", "tfconfig", "launch", "--chief",
             "--workers", "1", "--ps", "1", "--timeout", str(TIMEOUT), "--",
             sys.executable, "run_classifier.py", *_flags(
                 tiny_model, sst2, output_dir,
                 distribution_strategy="parameter_server",
                 pack_windows=arrangement == "packed")]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=TIMEOUT + 30)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  # 40 x 2 / (4 x k=2) = 10 updates, 20 micro-batches between both trainers.
  assert ("[chief:0] effective batch 8 = micro-batch 4 x k=2 per update, each "
          "of 2 worker(s) applying its own windows to the ps; 10 updates (20 "
          "micro-batches)") in result.stdout
  said = {"sorted": "sorted by length", "packed": "packed into rows"}
  for task in ("chief:0", "worker:0"):
    assert (f"[{task}] each window's 2 x 4 examples {said[arrangement]}"
            in result.stdout), result.stdout[-3000:]
  reader = tf.train.load_checkpoint(str(output_dir))
  assert reader.get_tensor("global_step") >= 20
  assert reader.get_tensor("gradient_accumulation/updates_applied") >= 8
  assert "[chief:0] eval on 10 held-out examples" in result.stdout


@pytest.mark.estimator
@pytest.mark.parametrize("stop_after, message", [
    (2, "run_classifier: error: training diverged: 2 windows in a row were "
     "skipped for non-finite gradients"),
    # Never stopped: the run trains on, skipping, and its evaluation is NaN.
    (0, "run_classifier: error: evaluation is not finite: eval_loss = nan"),
])
def test_a_diverged_run_exits_non_zero_with_one_line(stop_after, message,
                                                     tiny_model, sst2,
                                                     tmp_path):
  # 6 micro-batches: 3 windows, each skipped.
  result = _run(_flags(tiny_model, sst2, tmp_path / "run",
                       learning_rate=1e30, clip_norm=0, num_train_epochs=0.6,
                       max_consecutive_skipped_windows=stop_after))
  assert result.returncode == 3, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines()
            if line.startswith("run_classifier: error")]
  assert len(errors) == 1 and errors[0].startswith(message), (
      result.stderr[-3000:])
  # One line per skipped window, and no advice the script already follows.
  warnings = [line for line in result.stderr.splitlines()
              if "estimator_accum" in line and "WARNING" in line]
  assert warnings, result.stderr[-3000:]
  assert all("skipped the window ending at micro-batch" in line
             for line in warnings), warnings
  assert "reportable_loss" not in result.stderr


def _no_dropout_model(tiny_model, tmp_path):
  """The tiny model's files with dropout off (with --classifier_dropout=0):
  for what only holds without dropout (packed rows keep tf.nn.dropout, whose
  masks follow the rows)."""
  config = json.loads((tiny_model / "bert_config.json").read_text())
  config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = tmp_path / "model"
  model.mkdir()
  (model / "bert_config.json").write_text(json.dumps(config))
  for path in tiny_model.iterdir():
    if path.name != "bert_config.json":
      (model / path.name).symlink_to(path)
  return model


def kill_after_first_checkpoint_and_resume(model, data, output_dir, args,
                                           steps):
  """Starts run_classifier with `args` (a run of `steps` micro-batches),
  kills it (SIGKILL) once its checkpoint at micro-batch 6 is written, runs
  it again to its end, and checks that it said where it resumed."""
  command = [sys.executable, "run_classifier.py",
             *_flags(model, data, output_dir, **args)]
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + TIMEOUT
  while not list(output_dir.glob("model.ckpt-6.index")):
    assert process.poll() is None, "finished before it could be killed"
    assert time.monotonic() < deadline
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait()
  # Where the run goes on: its newest complete checkpoint, also one whose
  # save the kill stopped before the state file named it.
  killed_at = tf.train.load_checkpoint(integrity.newest_complete(
      str(output_dir))).get_tensor("global_step")
  assert killed_at < steps, "the run was not killed mid-training"
  resumed = _run(_flags(model, data, output_dir, **args))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"at micro-batch {killed_at}" in resumed.stdout


def assert_trained_to_the_same_weights(actual_dir, expected_dir, steps):
  """The model's weights (not the optimizer's slots) of the two runs'
  latest checkpoints agree at 1e-5, both at global step `steps`."""
  expected = tf.train.load_checkpoint(str(expected_dir))
  actual = tf.train.load_checkpoint(str(actual_dir))
  assert actual.get_tensor("global_step") == steps
  assert expected.get_tensor("global_step") == steps
  for name in expected.get_variable_to_shape_map():
    if name.startswith(("bert/", "output_")) and "adam" not in name.lower():
      np.testing.assert_allclose(actual.get_tensor(name),
                                 expected.get_tensor(name), rtol=1e-5,
                                 atol=1e-6, err_msg=name)


@pytest.mark.estimator
def test_a_run_killed_mid_training_resumes_to_the_uninterrupted_weights(
    tiny_model, sst2, tmp_path):
  # Dropout on: keyed by each example's place in the stream (the default),
  # the resumed run's masks are the uninterrupted run's.
  model = tiny_model
  # 60 micro-batches, a checkpoint every 6: killed once the one at 6 is
  # written, with most of the run ahead.
  args = dict(num_train_epochs=6, save_checkpoints_steps=6, do_eval=False)
  whole = _run(_flags(model, sst2, tmp_path / "whole", **args))
  assert whole.returncode == 0, whole.stderr[-3000:]

  output_dir = tmp_path / "killed"
  kill_after_first_checkpoint_and_resume(model, sst2, output_dir, args, 60)
  assert_trained_to_the_same_weights(output_dir, tmp_path / "whole", 60)
  kept = list(output_dir.glob("model.ckpt-*.index"))
  assert len(kept) == 2, kept  # --keep_checkpoint_max's default


@pytest.mark.estimator
def test_evaluating_a_directory_without_a_checkpoint_is_refused(
    tiny_model, sst2, tmp_path):
  result = _run(_flags(tiny_model, sst2, tmp_path / "empty", do_train=False))
  assert result.returncode != 0
  assert "Traceback" not in result.stderr
  assert ("run_classifier: error: --do_train=false: nothing to evaluate, "
          f"--output_dir={tmp_path / 'empty'} holds no checkpoint") in (
              result.stderr)


@pytest.mark.estimator
def test_another_task_or_model_in_the_same_output_dir_is_refused(
    tiny_model, sst2, tmp_path):
  output_dir = tmp_path / "run"
  first = _run(_flags(tiny_model, sst2, output_dir, num_train_epochs=0.1,
                      do_eval=False))
  assert first.returncode == 0, first.stderr[-3000:]
  _write_mrpc(sst2)
  second = _run(_flags(tiny_model, sst2, output_dir, task_name="mrpc"))
  assert second.returncode != 0
  assert "Traceback" not in second.stderr
  assert (f"run_classifier: error: --output_dir={output_dir} holds a run of "
          "task sst-2, not mrpc: give this run another --output_dir."
          ) in second.stderr, second.stderr[-2000:]
  config = json.loads((tiny_model / "bert_config.json").read_text())
  config["intermediate_size"] += 1
  other = tmp_path / "other_model"
  other.mkdir()
  (other / "bert_config.json").write_text(json.dumps(config))
  third = _run(_flags(tiny_model, sst2, output_dir, num_train_epochs=0.1,
                      bert_config_file=other / "bert_config.json",
                      init_checkpoint="", task_name="sst-2"))
  assert third.returncode != 0
  assert "holds a run of another model (intermediate_size" in third.stderr, (
      third.stderr[-2000:])
  # The file is written whole, then renamed into place (a cluster's tasks
  # start together); one that is not JSON is named, not a traceback.
  assert not list(output_dir.glob(".run_info.json.*"))
  (output_dir / "run_info.json").write_text("")
  fourth = _run(_flags(tiny_model, sst2, output_dir, num_train_epochs=0.1))
  assert fourth.returncode != 0
  assert "Traceback" not in fourth.stderr
  assert (f"run_classifier: error: --output_dir={output_dir} holds a "
          "run_info.json that is not JSON (Expecting value: line 1 column 1 "
          "(char 0)): remove it, or give this run another --output_dir."
          ) in fourth.stderr, fourth.stderr[-2000:]


@pytest.mark.estimator
def test_features_are_not_reused_for_other_data(tiny_model, sst2, tmp_path):
  """A second run in the same directory with another --data_dir trains on
  the other data's features, not on a cache of the first's."""
  output_dir = tmp_path / "run"
  args = dict(num_train_epochs=0.1, do_eval=False)
  first = _run(_flags(tiny_model, sst2, output_dir, **args))
  assert first.returncode == 0, first.stderr[-3000:]
  other = tmp_path / "other_data"
  other.mkdir()
  (other / "train.tsv").write_text(
      "sentence\tlabel\n" + "an entirely other film\t1\n" * 7)
  second = _run(_flags(tiny_model, other, output_dir, **args))
  assert second.returncode == 0, second.stderr[-3000:]
  assert "over 7 examples" in second.stdout, second.stdout
  files = sorted((output_dir / "features").glob("train-16-*.tf_record"))
  assert len(files) == 2, files


@pytest.mark.estimator
def test_the_script_shows_its_own_lines_not_tensorflows_chatter(main_run):
  quiet, _ = main_run  # train, eval and predict
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  output = quiet.stdout + quiet.stderr
  # The last three: XLA's first compile on CPU (the compiled window end),
  # logged by absl and at ERROR whatever TF_CPP_MIN_LOG_LEVEL hides.
  for chatter in ("is deprecated", "Instructions for updating",
                  "Calling model_fn", "Use tf.keras instead",
                  "Compiled cluster using XLA", "SetPriority unimplemented",
                  "absl::InitializeLog"):
    assert chatter not in output, chatter
  assert re.search(r"micro-batch (\d+)/\1 \(100%\)", quiet.stderr)


@pytest.mark.estimator
def test_verbose_shows_tensorflows_lines(tiny_model, sst2, tmp_path):
  verbose = _run(_flags(tiny_model, sst2, tmp_path / "verbose",
                        num_train_epochs=0.2, do_eval=False, verbose=True))
  assert verbose.returncode == 0, verbose.stderr[-3000:]
  assert "Calling model_fn" in verbose.stdout + verbose.stderr


@pytest.mark.parametrize("setting, on", [(None, True), ("0", False)])
def test_the_script_runs_onednn_unless_told_otherwise(setting, on):
  # oneDNN's kernels on every CPU (TensorFlow's default only with AVX-512;
  # faster on the main job at AVX2 too), unless TF_ENABLE_ONEDNN_OPTS says.
  # Exec'd: a forked child keeps the kernels of the process it came from.
  env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  env.update(ESTIMATOR_ACCUM_TEST_FORK="0", TF_CPP_MIN_LOG_LEVEL="3")
  if setting is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = setting
  done = subprocess.run(
      [sys.executable, "-c", "import os\nimport run_classifier\n"
       "from estimator_accum import runtime_private\n"
       "print(os.environ['TF_ENABLE_ONEDNN_OPTS'], "
       "runtime_private.onednn_enabled())"],
      env=env, capture_output=True, text=True, timeout=TIMEOUT)
  assert done.returncode == 0, done.stderr[-3000:]
  # (The setting is what the script asked for on any CPU; the kernels, what
  # TensorFlow then ran: on a CPU with AVX-512 that is on either way.)
  assert done.stdout.split() == [setting or "1", str(on)], (
      done.stdout + done.stderr[-2000:])


_CACHE_PROBE = """
import os
import run_classifier
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.bfloat16, [None, 8])
product = tf.matmul(x, tf.ones([8, 8], tf.bfloat16))
# One thread runs the ops: TensorFlow's own cache of kernels (1,024) is a
# thread's.
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                  use_per_session_threads=True)
with tf.compat.v1.Session(config=config) as session:
  # 1,100 row counts, then the first again: TensorFlow's cache has let it
  # go, and oneDNN's is asked for its kernel.
  for rows in list(range(1, 1101)) + [1]:
    session.run(product, {x: np.ones([rows, 8], np.float32)})
print("capacity", os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], flush=True)
"""


@pytest.mark.parametrize("setting", [None, "1024"])
def test_the_script_keeps_onednns_kernels_for_every_row_count(setting):
  # A product's kernel for a row count seen 1,100 shapes ago is still in
  # oneDNN's cache (16384 kernels) where the script sets it, and built
  # again at oneDNN's default of 1024 (a user's setting wins).
  env = {k: v for k, v in os.environ.items()
         if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
  env.update(ESTIMATOR_ACCUM_TEST_FORK="0", TF_CPP_MIN_LOG_LEVEL="3",
             ONEDNN_VERBOSE="2", TF_ENABLE_ONEDNN_OPTS="1")
  if setting is not None:
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = setting
  done = subprocess.run([sys.executable, "-c", _CACHE_PROBE], env=env,
                        capture_output=True, text=True, timeout=TIMEOUT)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert lines[-1] == f"capacity {setting or 16384}", lines[-3:]
  # (oneDNN 3.2's lines, TensorFlow 2.15's, begin "onednn_verbose,create:";
  # later ones "onednn_verbose,v1,primitive,create:".)
  builds = [re.search(r",create:(cache_\w+),", line).group(1)
            for line in lines
            if line.startswith("onednn_verbose,") and ",create:" in line and
            ",matmul," in line and ",1x8:8x8," in line]
  # The first row count's kernel: built, then asked for once more.
  again = "cache_hit" if setting is None else "cache_miss"
  assert builds == ["cache_miss", again], builds


@pytest.mark.estimator
@pytest.mark.memory
def test_recompute_trains_and_reports_its_peak_and_time(sst2, tmp_path):
  # Two layers: recomputation has a layer boundary to hold, and both train.
  tiny_model = _tiny_bert(tmp_path / "two_layers", layers=2)
  output_dir = tmp_path / "run"
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true")
  result = _run(_flags(tiny_model, sst2, output_dir, recompute=True), env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"trained 20 micro-batches in [\d.]+ s \([\d.]+ s each\); "
                   r"peak tensor memory [\d,]+ MB on CPU:0 \(the BFC "
                   r"allocator, as a GPU holds tensors\)", result.stdout), (
                       result.stdout)
  reader = tf.train.load_checkpoint(str(output_dir))
  assert reader.get_tensor("global_step") == 20
  _assert_summaries_at_the_first_step(output_dir)
  start = tf.train.load_checkpoint(str(tiny_model / "bert_model.ckpt"))
  for layer in (0, 1):
    name = f"bert/encoder/layer_{layer}/intermediate/dense/kernel"
    assert not np.allclose(reader.get_tensor(name), start.get_tensor(name))
  assert "eval_accuracy" in (output_dir / "eval_results.txt").read_text()


@pytest.mark.estimator
def test_every_split_of_a_window_trains_to_the_same_weights_dropout_on(
    tiny_model, sst2, tmp_path):
  # Keyed dropout (the default): micro-batch 4 x k=2 sorted, unpadded, the
  # last layer for [CLS] only (the defaults), 8 x k=1 with every position
  # computed, and 2 x k=4 meet the same masks: the same weights, dropout
  # on (the model's 0.1 and the classifier's). tf.nn.dropout's masks
  # follow the batch: its 4 x 2 and 8 x 1 differ.
  splits = {"4x2": {}, "8x1": dict(train_batch_size=8,
                                   gradient_accumulation_multiplier=1,
                                   unpadded=False, pooled_only=False),
            "2x4": dict(train_batch_size=2,
                        gradient_accumulation_multiplier=4),
            "4x2 tf.nn.dropout": dict(keyed_dropout=False),
            "8x1 tf.nn.dropout": dict(train_batch_size=8,
                                      gradient_accumulation_multiplier=1,
                                      keyed_dropout=False)}
  weights = {}
  for name, extra in splits.items():
    output_dir = tmp_path / name.replace(" ", "_")
    result = _run(_flags(tiny_model, sst2, output_dir, do_eval=False,
                         num_train_epochs=1, **extra))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "effective batch 8 = " in result.stdout, result.stdout
    weights[name] = tf.train.load_checkpoint(str(output_dir))
  names = [n for n in weights["4x2"].get_variable_to_shape_map()
           if n.startswith(("bert/", "output_")) and "adam" not in n.lower()]
  assert len(names) > 10
  start = tf.train.load_checkpoint(str(tiny_model / "bert_model.ckpt"))
  assert sum(not np.allclose(start.get_tensor(n), weights["4x2"].get_tensor(
      n)) for n in names if start.has_tensor(n)) > 10
  for split in ("8x1", "2x4"):
    assert weights[split].get_tensor("global_step") == 5 * (8 // int(
        split[0]))
    for name in names:
      np.testing.assert_allclose(weights[split].get_tensor(name),
                                 weights["4x2"].get_tensor(name), rtol=1e-5,
                                 atol=1e-6, err_msg=f"{split}: {name}")
  assert not all(np.allclose(
      weights["4x2 tf.nn.dropout"].get_tensor(name),
      weights["8x1 tf.nn.dropout"].get_tensor(name), rtol=1e-5, atol=1e-6)
      for name in names)


@pytest.mark.estimator
def test_windows_sorted_or_packed_train_to_the_same_weights(
    tiny_model, sst2, tmp_path):
  # Each window's 2 x 4 examples sorted by length into its micro-batches
  # (the default), or packed into rows of 16 tokens (--pack_windows), both
  # with the layers computing real tokens only (--unpadded) and the last
  # layer each example's first token only (--pooled_only, the defaults),
  # against the order the input gives them, every position computed: with
  # dropout off, the same update (tests/unit/models/test_classification_
  # data.py shows the arrangement changes and the padding shrinks).
  model = _no_dropout_model(tiny_model, tmp_path)
  weights = {}
  said = {"sorted": "examples sorted by length into its micro-batches",
          "packed": "examples packed into rows of 16 tokens, at most 8 a row "
                    "(--pack_windows): a micro-batch is at most 4 rows (what "
                    "the plan counts"}
  for arrangement in ("sorted", "packed", "plain"):
    output_dir = tmp_path / arrangement
    result = _run(_flags(model, sst2, output_dir, do_eval=False,
                         classifier_dropout=0, num_train_epochs=1,
                         sort_windows_by_length=arrangement == "sorted",
                         pack_windows=arrangement == "packed",
                         unpadded=arrangement != "plain",
                         pooled_only=arrangement != "plain"))
    assert result.returncode == 0, result.stderr[-3000:]
    for name, line in said.items():
      assert (line in result.stdout) == (name == arrangement), result.stdout
    assert ("the layers' dense parts compute real tokens only" in
            result.stdout) == (arrangement != "plain"), result.stdout
    assert ("the last layer computes each example's first token only" in
            result.stdout) == (arrangement != "plain"), result.stdout
    weights[arrangement] = tf.train.load_checkpoint(str(output_dir))
  names = [n for n in weights["plain"].get_variable_to_shape_map()
           if n.startswith(("bert/", "output_")) and "adam" not in n.lower()]
  assert len(names) > 10
  for arrangement in ("sorted", "packed"):
    for name in names:
      np.testing.assert_allclose(weights[arrangement].get_tensor(name),
                                 weights["plain"].get_tensor(name), rtol=1e-5,
                                 atol=1e-6, err_msg=f"{arrangement}: {name}")


def test_bfloat16_trains_with_float32_weights_and_window(tiny_model, sst2,
                                                         tmp_path):
  """--precision bfloat16 on every release: the dense products in
  bfloat16, the checkpoint float32 (the variables, Adam's slots, the
  accumulators), no loss scale; it evaluates; --use_fp16 with it is
  refused in one line."""
  output_dir = tmp_path / "run"
  # On any CPU (CI's may have no native bfloat16): the numerics.
  anywhere = dict(os.environ, ESTIMATOR_ACCUM_BFLOAT16_ANYWHERE="1")
  result = _run(_flags(tiny_model, sst2, output_dir, precision="bfloat16",
                       export_dir=tmp_path / "export"), env=anywhere)
  assert result.returncode == 0, result.stderr[-3000:]
  # The export's serving signature takes and gives what float32's does.
  from tensorflow.core.protobuf import saved_model_pb2  # noqa: PLC0415

  [version] = list((tmp_path / "export").iterdir())
  model = saved_model_pb2.SavedModel()
  model.ParseFromString((version / "saved_model.pb").read_bytes())
  signature = model.meta_graphs[0].signature_def["serving_default"]
  assert sorted(signature.inputs) == ["input_ids", "input_mask",
                                      "segment_ids"]
  assert signature.outputs["probabilities"].dtype == tf.float32.as_datatype_enum
  assert "the dense products take bfloat16 operands" in result.stdout
  reader = tf.train.load_checkpoint(str(output_dir))
  dtypes = reader.get_variable_to_dtype_map()
  assert reader.get_tensor("global_step") == 20
  assert "gradient_accumulation/loss_scale" not in dtypes
  floats = {name: dtype for name, dtype in dtypes.items()
            if dtype.is_floating}
  assert set(floats.values()) == {tf.float32}, floats
  assert any(name.endswith("/accum") for name in floats)
  assert "eval_accuracy" in (output_dir / "eval_results.txt").read_text()
  refused = _run(_flags(tiny_model, sst2, tmp_path / "both",
                        precision="bfloat16", use_fp16=True))
  assert refused.returncode != 0
  assert "--use_fp16 is --precision float16; give one of them" in (
      refused.stderr + refused.stdout)
  assert "Traceback" not in refused.stderr
  # Where the products are not native (oneDNN held below its bf16
  # instructions, or oneDNN off), refused in one line unless asked.
  slow = _run(_flags(tiny_model, sst2, tmp_path / "slow",
                     precision="bfloat16"),
              env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0"))
  assert slow.returncode != 0
  assert "--precision bfloat16: this machine has no native bfloat16" in (
      slow.stderr + slow.stdout)
