"""The test session's temporary files (tests/conftest.py): its children
write them in the session's own directory, removed when it ends, so one
that ends by a signal or os._exit leaves nothing in /tmp."""

import os
import subprocess
import sys

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
