"""estimator_accum/distribution/ports.py: which processes close their port
on import, and the settings' errors. The closing itself, attacked for real,
is in tests/integration/test_closed_ports.py."""

import io
import json

import pytest

from estimator_accum.distribution import ports

CLUSTER = {"worker": ["127.0.0.1:23462", "[::1]:23463"]}


def _environ(task=None, **extra):
  environ = {"TF_CONFIG": json.dumps(
      {"cluster": CLUSTER, "task": task or {"type": "worker", "index": 1}})}
  environ.update(extra)
  return environ


@pytest.mark.parametrize("environ", [
    {},
    {"TF_CONFIG": "not json"},
    {"TF_CONFIG": json.dumps({"cluster": CLUSTER})},
    _environ({"type": "evaluator", "index": 0}),
    _environ({"type": "worker", "index": 2}),
    _environ(ESTIMATOR_ACCUM_PORTS="tfconfig launch:namespace"),
    {"TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost"]},
                              "task": {"type": "worker", "index": 0}})},
    {"TF_CONFIG": json.dumps({"cluster": {"worker": "127.0.0.1:1"},
                              "task": {"type": "worker", "index": "x"}})},
], ids=["no TF_CONFIG", "malformed", "no task", "evaluator",
        "not listed", "closed by a launcher", "no port", "bad index"])
def test_nothing_to_close(environ):
  log = io.StringIO()
  before = dict(environ)
  assert ports.close_own_port(environ, log) is None
  assert environ == before and log.getvalue() == ""


def test_open_on_request_leaves_the_port_and_says_so():
  environ = _environ(ESTIMATOR_ACCUM_ISOLATION="open")
  log = io.StringIO()
  assert ports.close_own_port(environ, log) == "open"
  assert log.getvalue() == (
      "[estimator_accum] worker:1: port 23463 left open to every host and "
      "local user (ESTIMATOR_ACCUM_ISOLATION=open)\n")
  # Its helpers are the same task: they leave the port as it is.
  assert environ["ESTIMATOR_ACCUM_PORTS"] == "estimator_accum:open"
  assert ports.close_own_port(environ, log) is None


@pytest.mark.parametrize("value", ["namespace", "closed", ""])
def test_a_setting_it_cannot_take_is_named(value):
  with pytest.raises(ports.PortsError) as error:
    ports.close_own_port(_environ(ESTIMATOR_ACCUM_ISOLATION=value),
                         io.StringIO())
  assert str(error.value) == (
      f"ESTIMATOR_ACCUM_ISOLATION={value!r}: one of auto, firewall, open")
