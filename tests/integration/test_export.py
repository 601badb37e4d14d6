"""run_classifier.py --export_dir: a SavedModel that serving loads, checked
in fresh processes against Estimator's predict (tests/jobs/serving_check.py
with tf.saved_model.load, and TensorFlow's saved_model_cli), with the
text signature's in-graph tokenization against models.bert.tokenization."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tests.integration import test_run_classifier as base

pytestmark = pytest.mark.slow

tiny_model = base.tiny_model
TOLERANCE = 1e-5


def _export(tiny_model, data, tmp_path, task="sst-2", **extra):
  output_dir, export_dir = tmp_path / "run", tmp_path / "export"
  done = base._run(base._flags(tiny_model, data, output_dir, task_name=task,
                               export_dir=export_dir, do_predict=False,
                               **extra))
  assert done.returncode == 0, done.stderr[-3000:]
  line = next(li for li in done.stdout.splitlines()
              if li.startswith("exported for serving to "))
  path = line.split(" to ", 1)[1].split(" (", 1)[0]
  assert path.startswith(str(export_dir)) and path.split("/")[-1].isdigit()
  return output_dir, path


def _check(path, output_dir, task, data, model):
  done = subprocess.run(
      [sys.executable, "tests/jobs/serving_check.py", path, str(output_dir),
       task, str(data), "16", str(model / "bert_config.json")],
      capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  line = next(li for li in done.stdout.splitlines()
              if li.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
  """(output_dir, export path, data dir) of one sst-2 run, for the tests
  that read it."""
  root = tmp_path_factory.mktemp("exported")
  data = root / "data"
  data.mkdir()
  rows = ([(t, 1) for t in base.POSITIVE] + [(t, 0) for t in base.NEGATIVE])
  body = "".join(f"{text}\t{label}\n" for text, label in rows)
  (data / "train.tsv").write_text("sentence\tlabel\n" + body * 4)
  (data / "dev.tsv").write_text("sentence\tlabel\n" + body)
  output_dir, path = _export(tiny_model, data, root)
  return output_dir, path, data


def _mismatches(result):
  """Examples whose in-graph ids differ from models.bert.tokenization's."""
  graph, made = result["graph_ids"], result["feature_ids"]
  return [i for i in range(len(made["input_ids"]))
          if any(graph[k][i] != made[k][i] for k in made)]


def test_the_export_serves_what_estimator_predicts(tiny_model, exported):
  output_dir, path, data = exported
  result = _check(path, output_dir, "sst-2", data, tiny_model)
  predict = np.array(result["predict"])
  assert predict.shape == (10, 2)
  for key in ("by_ids", "short", "by_text"):
    np.testing.assert_allclose(result[key], predict, rtol=0,
                               atol=TOLERANCE, err_msg=key)
  assert _mismatches(result) == []


def test_a_sentence_pair_task_takes_two_strings(tiny_model, tmp_path):
  data = tmp_path / "mrpc"
  data.mkdir()
  base._write_mrpc(data)
  output_dir, path = _export(tiny_model, data, tmp_path, task="mrpc")
  result = _check(path, output_dir, "mrpc", data, tiny_model)
  np.testing.assert_allclose(result["by_text"], result["predict"], rtol=0,
                             atol=TOLERANCE)
  assert _mismatches(result) == []


def test_saved_model_cli_runs_it_and_it_holds_no_window(tiny_model, exported,
                                                        tmp_path):
  output_dir, path, sst2 = exported
  shown = subprocess.run(
      [sys.executable, "-m", "models.bert.saved_model_cli", "show", "--dir",
       path, "--all"], capture_output=True, text=True, timeout=120)
  assert shown.returncode == 0, shown.stderr[-2000:]
  for expected in ("signature_def['serving_default']", "signature_def['text']",
                   "inputs['input_ids']", "inputs['input_mask']",
                   "inputs['segment_ids']", "inputs['text']",
                   "outputs['probabilities']"):
    assert expected in shown.stdout, expected
  assert "label_ids" not in shown.stdout
  outdir = tmp_path / "cli"
  ran = subprocess.run(
      [sys.executable, "-m", "models.bert.saved_model_cli", "run", "--dir",
       path, "--tag_set", "serve", "--signature_def", "text",
       "--input_exprs", 'text=["the film was great fun", "awful acting"]',
       "--outdir", str(outdir)], capture_output=True, text=True, timeout=120)
  assert ran.returncode == 0, ran.stderr[-2000:]
  cli = np.load(outdir / "probabilities.npy")
  checked = _check(path, output_dir, "sst-2", sst2, tiny_model)
  # Dev rows 0 and 7 are those two sentences (base.POSITIVE, base.NEGATIVE).
  np.testing.assert_allclose(cli, np.array(checked["predict"])[[0, 7]],
                             rtol=0, atol=TOLERANCE)
  # Only the model: no accumulator, window state, optimizer slot or step.
  names = [name for name, _ in tf.train.list_variables(
      f"{path}/variables/variables")]
  assert names and not [n for n in names if any(
      word in n.lower() for word in ("accum", "gradient_accumulation",
                                     "window", "adam", "micro_batches"))]
  model = saved_model_pb2.SavedModel()
  model.ParseFromString(open(f"{path}/saved_model.pb", "rb").read())
  ops = {node.op for node in model.meta_graphs[0].graph_def.node}
  assert not [op for op in ops if "Apply" in op or op == "AssignAddVariableOp"]
  assert "train_op" not in model.meta_graphs[0].collection_def
  assert any(p.name == "vocab.txt"
             for p in pathlib.Path(path).rglob("*"))


@pytest.mark.estimator
@pytest.mark.parametrize("example, flags", [
    ("housing", ["--epochs", "2"]),
    ("mnist", ["--train_size", "512", "--compare=false"]),
])
def test_the_examples_export_what_they_predict(example, flags, tmp_path):
  run, export_dir = tmp_path / "run", tmp_path / "export"
  done = subprocess.run(
      [sys.executable, "-m", f"models.{example}", *flags, "--model_dir",
       str(run), "--export_dir", str(export_dir)],
      capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  line = next(li for li in done.stdout.splitlines()
              if li.startswith("exported for serving to "))
  path = line.split(" to ", 1)[1].split(" (", 1)[0]
  run_dir = next(p for p in run.iterdir() if p.is_dir() and
                 (p / "checkpoint").exists() and "plain" not in p.name)
  checked = subprocess.run(
      [sys.executable, "tests/jobs/tensor_serving_check.py", example,
       str(run_dir), path], capture_output=True, text=True, timeout=300)
  assert checked.returncode == 0, checked.stderr[-3000:]
  result = json.loads(next(li for li in checked.stdout.splitlines()
                           if li.startswith("RESULT "))[len("RESULT "):])
  assert result["examples"] == 64
  assert result["differences"] and max(
      result["differences"].values()) <= TOLERANCE, result["differences"]
  assert result["variables"] and not [
      v for v in result["variables"]
      if "accum" in v or "gradient_accumulation" in v or "Momentum" in v]


def test_a_disk_full_during_the_export_is_named_and_freeing_it_exports(
    tiny_model, exported, tmp_path):
  """--export_dir on a full disk (a tmpfs mounted by the test, filled):
  one line naming the export directory, the bytes the variables take and
  the bytes free, exit 5, no SavedModel half written left there (neither
  Estimator's temp-<version> nor the session runner's <version>.temp);
  with the disk freed, the same command exports it."""
  from tests.helpers import small_disk  # noqa: PLC0415

  output_dir, _, data = exported
  with small_disk.mounted(tmp_path / "disk", "16m") as disk:
    filler = disk / "filler"
    small_disk.fill(filler)
    export_dir = disk / "export"
    flags = base._flags(tiny_model, data, output_dir, do_train=False,
                        do_eval=False, export_dir=export_dir)
    full = base._run(flags)
    assert full.returncode == 5, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"run_classifier: error: --export_dir={export_dir}: the disk is full "
        f"(No space left on device): the SavedModel's variables take "), last
    assert last.endswith("; nothing was exported: free space and run again "
                         "to export it."), last
    assert not list(export_dir.glob("*")), list(export_dir.iterdir())
    filler.unlink()
    again = base._run(flags)
    assert again.returncode == 0, again.stderr[-3000:]
    [version] = list(export_dir.iterdir())
    assert version.name.isdigit() and (version / "saved_model.pb").exists()
