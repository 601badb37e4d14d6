"""What the scripts' console keeps of TensorFlow's own lines
(`models/console.py`): its warnings and errors, not the lines about the
tf.compat.v1 API the scripts use on purpose, nor Estimator's step counter
taking two reads of global_step for a stall. In a process of its own: the
quieting changes the process's loggers."""

import os
import subprocess
import sys

import pytest

from models import console

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

PROGRAM = """
import tensorflow as tf
from models import console
console.quiet_tensorflow(False)
logger = tf.get_logger()
logger.warning("It seems that global step (tf.train.get_global_step) has "
               "not been increased. Current value (could be stable): 7 vs "
               "previous value: 7.")
logger.warning("From x.py:1: foo is deprecated and will be removed in a "
               "future version.")
logger.warning("a warning about the run itself")
"""


def test_the_scripts_keep_tensorflows_warnings_but_not_its_chatter():
  result = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert "a warning about the run itself" in result.stderr
  assert "global step" not in result.stderr, result.stderr
  assert "deprecated" not in result.stderr, result.stderr


QUIET_START = """
import os, signal, sys
import tensorflow as tf
from models import console

def stopped(number, frame):
  print("stopped by SIGTERM", file=sys.stderr, flush=True)

signal.signal(signal.SIGTERM, stopped)
function = tf.function

def signalled_function(*args, **kwargs):
  os.kill(os.getpid(), signal.SIGTERM)  # in the middle of the quiet start
  return function(*args, **kwargs)

tf.function = signalled_function
console.quiet_xla_start(False)
print("started", file=sys.stderr, flush=True)
"""


def test_a_sigterm_during_the_quiet_xla_start_is_handled_with_stderr_back():
  result = subprocess.run([sys.executable, "-c", QUIET_START], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert "stopped by SIGTERM\nstarted" in result.stderr, result.stderr
  assert "Compiled cluster using XLA" not in result.stderr, result.stderr


LOADED = """
import os, sys
os.write(2, b"before\\n")
from models import quiet_import
os.write(2, b"after\\n")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_tensorflows_lines_while_it_loads_are_held_back(verbose):
  """A script's first lines are its own: what TensorFlow 2.16+ writes
  while it loads (absl's notice, INFO lines) is held back, the rest
  written after; `--verbose` holds nothing back. The lines are a real
  TensorFlow's where this one writes them (2.16+), else none."""
  result = subprocess.run(
      [sys.executable, "-c", LOADED] + (["--verbose"] if verbose else []),
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stderr.splitlines()
  assert lines[0] == "before" and lines[-1] == "after", lines
  if not verbose:
    assert lines == ["before", "after"], lines


def test_the_held_lines_that_say_something_are_written(capsys):
  held = [
      "WARNING: All log messages before absl::InitializeLog() is called are "
      "written to STDERR",
      "I0000 00:00:1.0    42 port.cc:153] oneDNN custom operations are on.",
      "I0000 00:00:1.0    42 cpu_feature_guard.cc:227] This TensorFlow binary",
      "To enable the following instructions: AVX2 FMA, in other operations",
      "W0000 00:00:1.0    42 some.cc:1] a warning that says something",
      "E0000 00:00:1.0    42 other.cc:2] an error that says something"]
  console._write_said(held)  # noqa: SLF001
  written = capsys.readouterr().err.splitlines()
  assert written == held[4:], written
