"""The test session's process (tests/conftest.py): its temporary files,
which its children write in the session's own directory, removed when it
ends, so one that ends by a signal or os._exit leaves nothing in /tmp; and
what its collection imported, frozen out of the garbage collector's
reach."""

import gc
import os
import subprocess
import sys
import weakref

from tests import conftest

LEAVES_A_FILE = ("import os, tempfile\n"
                 "print(tempfile.NamedTemporaryFile(delete=False).name)\n"
                 "os._exit(0)  # as a stopped task does: no cleanup\n")


def test_a_child_ended_without_cleanup_leaves_its_file_in_the_sessions_dir():
  session = os.environ[conftest._TMP_ENV]  # noqa: SLF001
  assert os.path.basename(session).startswith("estimator_accum_tests_")
  assert os.environ["TMPDIR"] == session
  done = subprocess.run([sys.executable, "-c", LEAVES_A_FILE],
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  left = done.stdout.strip()
  assert os.path.dirname(left) == session, left
  os.remove(left)


def test_pytest_keeps_its_tmp_path_where_it_was(tmp_path):
  # pytest's own directories (kept for a failed run's inspection) are not
  # in the session's directory, which goes at its end.
  session = os.environ[conftest._TMP_ENV]  # noqa: SLF001
  assert not str(tmp_path).startswith(session)
  assert str(tmp_path).startswith(os.path.dirname(session))


def test_what_the_collection_imported_is_out_of_the_collectors_reach():
  # tests/conftest.py freezes it: TensorFlow's own objects alone are
  # ~270,000, walked by every full collection otherwise. A test's own
  # garbage is still collected.
  assert gc.get_freeze_count() > 100_000
  made = []
  alive = weakref.ref(_Box(made))  # a cycle only the collector frees
  del made
  gc.collect()
  assert alive() is None


class _Box:
  def __init__(self, value):
    self.value = value
    value.append(self)
