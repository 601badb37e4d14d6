"""The plan cache of --micro_batch_size fastest (models/batch_plan.py):
what keys it, when it is used, and a run directory given the cached plan."""

import json

import pytest

import estimator_accum
from models import batch_plan
from models.script_flags import FlagValues

SIGNATURE = {"script": "test", "flags": {"max_seq_length": 128}}


def _values(**changes):
  values = dict(micro_batch_size="fastest", memory_budget_mb=1000.0,
                memory_margin=0.1, plan_cache=True, recompute=False)
  values.update(changes)
  return FlagValues(values, ())


def _key(values=None, effective_batch=32, replicas=1, signature=SIGNATURE):
  return batch_plan.cache_key(values or _values(), effective_batch, replicas,
                              signature)[0]


def test_the_key_changes_with_what_the_plan_was_measured_from(monkeypatch):
  base = _key()
  assert _key() == base and len(base) == 16
  others = [
      _key(_values(memory_budget_mb=2000.0)),
      _key(_values(memory_margin=0.2)),
      _key(effective_batch=64),
      _key(replicas=2),
      _key(signature={"script": "test", "flags": {"max_seq_length": 64}}),
  ]
  monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
  others.append(_key())
  assert len({base, *others}) == len(others) + 1, others


def test_only_fastest_with_a_cache_directory_uses_it(monkeypatch, tmp_path):
  monkeypatch.setenv(batch_plan.CACHE_ENV, str(tmp_path))
  entry = batch_plan._cache_entry(_values(), 32, 1, SIGNATURE)
  assert entry[0].startswith(str(tmp_path)) and entry[0].endswith(".json")
  assert batch_plan._cache_entry(_values(micro_batch_size="auto"), 32, 1,
                                 SIGNATURE) is None
  assert batch_plan._cache_entry(_values(plan_cache=False), 32, 1,
                                 SIGNATURE) is None
  assert batch_plan._cache_entry(_values(), 32, 1, None) is None
  monkeypatch.setenv(batch_plan.CACHE_ENV, "")
  assert batch_plan._cache_entry(_values(), 32, 1, SIGNATURE) is None


def test_a_cached_plan_is_the_runs_and_a_foreign_one_is_not(
    monkeypatch, tmp_path, capsys):
  monkeypatch.setenv(batch_plan.CACHE_ENV, str(tmp_path / "cache"))
  plan = estimator_accum.MicroBatchPlan.given(32, 16)
  entry = batch_plan._cache_entry(_values(), 32, 1, SIGNATURE)
  batch_plan._keep(entry, plan)

  def no_build(micro_batch, k):
    raise AssertionError("a cached plan is not measured")

  run_dir = tmp_path / "run"
  run_dir.mkdir()
  got = batch_plan.resolve(_values(), build=no_build, effective_batch=32,
                           replicas=1, run_dir=str(run_dir), is_chief=True,
                           signature=SIGNATURE)
  assert got == plan
  assert "plan from the plan cache" in capsys.readouterr().out
  assert json.loads((run_dir / batch_plan.PLAN_FILE).read_text())[
      "micro_batch"] == 16
  # The same file under another key (copied by hand): not this run's plan.
  other = batch_plan._cache_entry(_values(memory_budget_mb=5.0), 32, 1,
                                  SIGNATURE)
  with open(other[0], "w") as writer:
    writer.write(open(entry[0]).read())
  assert batch_plan._cached(other, 32) is None
  assert "was measured for something else: timing again" in (
      capsys.readouterr().out)


def test_a_cache_that_cannot_be_written_is_a_line(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("")
  batch_plan._keep((str(blocker / "plans" / "x.json"), {}),
                   estimator_accum.MicroBatchPlan.given(32, 16))
  assert "not written" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["fastest", "auto"])
def test_both_measured_values_are_accepted(value):
  batch_plan.check_flags(_values(micro_batch_size=value), [])


def test_a_cache_file_cut_short_is_a_line_and_measured_again(
    monkeypatch, tmp_path, capsys):
  monkeypatch.setenv(batch_plan.CACHE_ENV, str(tmp_path))
  entry = batch_plan._cache_entry(_values(), 32, 1, SIGNATURE)
  batch_plan._keep(entry, estimator_accum.MicroBatchPlan.given(32, 16))
  with open(entry[0]) as reader:
    whole = reader.read()
  with open(entry[0], "w") as writer:
    writer.write(whole[:40])
  assert batch_plan._cached(entry, 32) is None
  assert f"plan cache {entry[0]} cannot be read (JSONDecodeError" in (
      capsys.readouterr().out)
