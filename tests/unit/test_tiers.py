"""The README's suite, --extended and --extended-share (tests/conftest.py,
tests/extended.py): what each collects, read from pytest's own collection
of the whole of `tests` in a fresh process."""

import json
import os
import subprocess
import sys

import pytest

from tests.extended import EXTENDED

pytestmark = pytest.mark.slow  # a process that collects the suite eight times

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

# One process collects `tests` eight ways (pytest.main again and again: the
# test modules import once), and prints what each collected, or the error.
_COLLECT = r"""
import json, sys
import pytest

class Ids:
  def __init__(self):
    self.ids = []
  def pytest_collection_finish(self, session):
    self.ids = [item.nodeid for item in session.items]

runs = {}
for name, extra in [("suite", []), ("extended", ["--extended"]),
                    ("share0", ["--extended-share=0/2"]),
                    ("share1", ["--extended-share=1/2"]),
                    ("half0", ["--share=0/2"]), ("half1", ["--share=1/2"]),
                    ("bad", ["--extended-share=2/2"])]:
  ids = Ids()
  code = pytest.main(["tests", "--collect-only", "-q",
                      "-p", "no:cacheprovider", *extra], plugins=[ids])
  runs[name] = [int(code), ids.ids]
from tests.extended import EXTENDED
EXTENDED["tests/unit/test_gone.py::test_renamed"] = "a stale entry"
ids = Ids()
runs["stale"] = [int(pytest.main(["tests", "--collect-only", "-q", "-p",
                                  "no:cacheprovider"], plugins=[ids])), []]
print("RUNS " + json.dumps(runs))
"""


@pytest.fixture(scope="module")
def runs():
  done = subprocess.run([sys.executable, "-c", _COLLECT], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  line = [out for out in done.stdout.splitlines() if out.startswith("RUNS ")]
  assert line, done.stdout[-3000:] + done.stderr[-3000:]
  found = {name: (code, set(ids))
           for name, (code, ids) in json.loads(line[0][5:]).items()}
  found["output"] = done.stdout + done.stderr
  return found


def _listed(node_id):
  return node_id.startswith(tuple(EXTENDED))


def test_the_suite_leaves_out_exactly_what_extended_py_lists(runs):
  code, suite = runs["suite"]
  assert code == 0
  every = runs["extended"][1]
  assert suite < every
  assert {i for i in every if _listed(i)} == every - suite
  assert not any(_listed(i) for i in suite)


def test_the_shares_run_each_left_out_test_once(runs):
  every, suite = runs["extended"][1], runs["suite"][1]
  (code0, share0), (code1, share1) = runs["share0"], runs["share1"]
  assert code0 == code1 == 0 and share0 and share1
  assert not share0 & share1
  assert share0 | share1 == every - suite


def test_share_splits_what_is_selected_in_two_without_overlap(runs):
  """--share=I/N (CI's half of the fast tier on the other oneDNN path and
  on TensorFlow 2.21) splits the suite, not only the further cases."""
  suite = runs["suite"][1]
  (code0, half0), (code1, half1) = runs["half0"], runs["half1"]
  assert code0 == code1 == 0 and half0 and half1
  assert not half0 & half1 and half0 | half1 == suite
  # Halves of a fair size: a stable hash of the node id, not its crc32's
  # lowest bit, which split the fast tier 43/57.
  assert 0.4 < len(half0) / len(suite) < 0.6, (len(half0), len(suite))


def test_a_bad_share_is_a_usage_error_in_one_line(runs):
  assert runs["bad"][0] == pytest.ExitCode.USAGE_ERROR
  assert ("--extended-share=2/2: must be I/N with 0 <= I < N, as 2/8"
          in runs["output"]), runs["output"][-2000:]


def test_every_left_out_test_names_what_covers_it_in_the_suite():
  for prefix, why in EXTENDED.items():
    assert prefix.startswith("tests/") and "::" in prefix, prefix
    assert isinstance(why, str) and len(why) > 10, (prefix, why)


def test_an_entry_that_matches_nothing_is_a_usage_error(runs):
  assert runs["stale"][0] == pytest.ExitCode.USAGE_ERROR
  assert ("tests/extended.py names tests that were not collected: "
          "tests/unit/test_gone.py::test_renamed") in runs["output"]
