"""pytest fixtures shared by the test suite."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Memory is measured from the allocator's statistics. TensorFlow's plain CPU
# allocator (oneDNN off: the default on CPUs without AVX-512) keeps none;
# the BFC allocator keeps them on every CPU, and holds tensors as a GPU
# does. It is chosen when TensorFlow starts, so here, before the import.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# No plan cache shared between tests (or with the user's runs): the tests
# of the cache give theirs (models/batch_plan.py's CACHE_ENV).
os.environ.setdefault("ESTIMATOR_ACCUM_PLAN_CACHE", "")
# Nor shared features: each test's run tokenizes into its own directory
# (the tests of the shared features give theirs).
os.environ.setdefault("ESTIMATOR_ACCUM_FEATURE_CACHE", "")

import atexit  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# The session's temporary files (autograph's converted functions, above
# all) go to one directory, removed at the session's end: a child that ends
# by a signal or os._exit (the preemption and fault tests) never removes
# its own, and left a few hundred files in /tmp per run. pytest's tmp_path
# stays where it was (gettempdir is read first; xdist's workers take it
# from pytest).
_TMP_ENV = "ESTIMATOR_ACCUM_TEST_TMPDIR"
if not os.environ.get(_TMP_ENV):
  tempfile.gettempdir()
  os.environ[_TMP_ENV] = os.environ["TMPDIR"] = tempfile.mkdtemp(
      prefix="estimator_accum_tests_")
  atexit.register(shutil.rmtree, os.environ[_TMP_ENV], True)

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.helpers import fork_start, grappler  # noqa: E402

# The suite's sessions run without Grappler unless their config asks it
# for a pass or the test is about it (tests/helpers/grappler.py: the fast
# tier a fifth less CPU); ESTIMATOR_ACCUM_TEST_GRAPPLER=default runs them
# as users do. Set here for the whole session, its children included.
os.environ.setdefault(grappler.ENV, "off")
grappler.install()

# The session's Python children start forked from a process that has
# TensorFlow imported (tests/helpers/fork_start.py: 3 s less CPU each);
# ESTIMATOR_ACCUM_TEST_FORK=0 turns that off. The process that sets it up
# (pytest itself; xdist's workers inherit it) stops it at its exit.
if (not os.environ.get(fork_start.DIR_ENV) and
    os.environ.get(fork_start.SWITCH_ENV) != "0"):
  _FORK_DIR = tempfile.mkdtemp(prefix="estimator_accum_fork_")
  fork_start.start_session(_FORK_DIR)

  @atexit.register
  def _stop_forking():
    fork_start.stop_session(_FORK_DIR)
    shutil.rmtree(_FORK_DIR, ignore_errors=True)
elif os.environ.get(fork_start.SWITCH_ENV) != "0":
  fork_start.install()
else:
  fork_start.put_site_on_path()  # its sitecustomize sets up grappler

# Two logical CPU devices for the MirroredStrategy tests. This must happen
# before TensorFlow's runtime starts, so at import, before any test.
NUM_LOGICAL_CPUS = 2
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


def _keras3_major():
  """The major version of the `keras` package (2 on TensorFlow 2.15)."""
  import keras  # noqa: PLC0415

  return int(keras.__version__.split(".")[0])


def _skip_what_this_tensorflow_cannot_run(items):
  """Skips, with the reason, what this TensorFlow cannot run: tests marked
  `estimator` where it has no tf.estimator (2.16+), tests marked `keras2`
  where tf.keras is Keras 3, tests marked `keras3` where `keras` is not."""
  from estimator_accum import releases  # noqa: PLC0415

  reasons = {}
  if releases.estimator() is None:
    reasons["estimator"] = (f"needs tf.estimator, which TensorFlow "
                            f"{tf.__version__} does not have")
  if releases.keras_major() >= 3:
    reasons["keras2"] = ("needs Keras 2; tf.keras is Keras 3 here (tf-keras "
                         "with TF_USE_LEGACY_KERAS=1 runs it)")
  if _keras3_major() < 3:
    reasons["keras3"] = ("needs Keras 3 (the keras package, TensorFlow "
                         "2.16+); this environment's is Keras 2")
  for item in items:
    for marker, reason in reasons.items():
      if item.get_closest_marker(marker):
        item.add_marker(pytest.mark.skip(reason=reason))


# The fast tier (`pytest -m "not slow"`, about 4 minutes on 2 cores without
# AVX-512) is every test not marked slow: a module that runs whole
# Estimator jobs, BERT, other processes or clusters says
# `pytestmark = pytest.mark.slow`, and so does a test that starts a cluster,
# measures memory or takes more than a few seconds; a new module is in the
# fast tier unless it does. The README's suite is both tiers less what
# tests/extended.py leaves to --extended.


@pytest.fixture(params=["cf_v2", "cf_v1"])
def control_flow(request):
  """Runs the test under control flow v2 (TF 2 default) and v1."""
  if request.param == "cf_v1":
    tf.compat.v1.disable_control_flow_v2()
  else:
    tf.compat.v1.enable_control_flow_v2()
  yield request.param
  tf.compat.v1.enable_control_flow_v2()


def pytest_collection_finish(session):
  """What the collection imported (TensorFlow, Keras, the test modules: some
  270,000 objects that live as long as the process) moves out of the
  cyclic garbage collector's reach (`gc.freeze`): every full collection
  walked them all, ~0.12 s each, dozens of times a module as tests build
  graphs, and the planner's own `gc.collect()` around each measurement
  (test_planner.py alone: 33 s -> 21 s, its collections 11.8 s -> 0.8 s).
  Only objects made before the first test: a test's garbage is collected
  as before. The fork server does the same before it forks
  (tests/helpers/fork_start.py)."""
  del session
  gc.freeze()


def pytest_addoption(parser):
  parser.addoption(
      "--extended", action="store_true",
      help="also run the further cases tests/extended.py leaves out of the "
           "README's suite")
  parser.addoption(
      "--extended-share", metavar="I/N", default=None,
      help="run only the I-th of N shares of those further cases, none of "
           "the README's suite (CI runs one share each time, picked by the "
           "commit count)")
  parser.addoption(
      "--share", metavar="I/N", default=None,
      help="run only the I-th of N shares of what is otherwise selected "
           "(CI's reruns of the fast tier under the other oneDNN path and "
           "TensorFlow 2.21 take half each time, picked by the commit count)")


def _share_option(config, name):
  """(i, n) from --NAME=I/N, or None; a bad value is one line."""
  text = config.getoption(name)
  if text is None:
    return None
  try:
    i, n = (int(part) for part in text.split("/"))
  except ValueError:
    i = n = 0
  if not 0 <= i < n:
    raise pytest.UsageError(
        f"--{name.replace('_', '-')}={text}: must be I/N with 0 <= I < N, "
        "as 2/8")
  return i, n


def _in_share(item, share):
  """Whether `item` is in share (i, n): a stable hash of its node id, so a
  test's share is the same in every run and on every machine."""
  digest = hashlib.sha1(item.nodeid.encode()).digest()  # noqa: S324
  return int.from_bytes(digest[:8], "big") % share[1] == share[0]


def _keep(config, items, kept, dropped):
  """`items` becomes `kept`; `dropped` is reported as deselected (pytest
  counts them), not skipped."""
  if dropped:
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _keep_share(config, items):
  """Under --share=I/N, deselects all but the I-th share of `items`."""
  share = _share_option(config, "share")
  if share is None:
    return
  kept, dropped = [], []
  for item in items:
    (kept if _in_share(item, share) else dropped).append(item)
  _keep(config, items, kept, dropped)


def _deselect_extended(config, items):
  """Deselects (pytest reports how many) the tests tests/extended.py lists,
  unless --extended; under --extended-share=I/N, everything but the I-th
  share of them (by a stable hash of the node id: the shares are fixed,
  and N runs with I = 0..N-1 run each extended test once)."""
  from tests.extended import EXTENDED  # noqa: PLC0415

  if config.getoption("extended"):
    return
  share = _share_option(config, "extended_share")
  prefixes = tuple(EXTENDED)
  matched = set()
  kept, dropped = [], []
  for item in items:
    hits = [p for p in prefixes if item.nodeid.startswith(p)]
    matched.update(hits)
    if share:
      chosen = bool(hits) and _in_share(item, share)
    else:
      chosen = not hits
    (kept if chosen else dropped).append(item)
  whole = [os.path.abspath(str(a)) for a in config.args] in (
      [], [os.path.abspath(str(config.rootpath / "tests"))])
  stale = sorted(set(prefixes) - matched)
  if (whole and stale and not config.getoption("keyword") and
      not config.getoption("markexpr")):
    raise pytest.UsageError(
        "tests/extended.py names tests that were not collected: "
        + ", ".join(stale))
  _keep(config, items, kept, dropped)


# Modules whose tests mostly wait on other processes (Slurm's daemons, links
# cut for seconds, the allocator's 10 s retry before an out-of-memory
# error) say RUNS_EARLY = True: they run first, so that their waits overlap
# the other workers' CPU-bound tests instead of ending the run on an idle
# machine (they were its last 25 s). Order only: pytest-randomly's shuffle
# (CI's fast tier) still applies within each part.
def pytest_collection_modifyitems(config, items):
  _deselect_extended(config, items)
  _keep_share(config, items)
  _skip_what_this_tensorflow_cannot_run(items)
  early = [item for item in items
           if getattr(getattr(item, "module", None), "RUNS_EARLY", False)]
  if early:
    chosen = set(early)
    items[:] = early + [item for item in items if item not in chosen]


# A file each test's own CPU seconds (the pytest process's, setup, call and
# teardown; children started by exec that it waited for, apart) are appended
# to, tab-separated with its node id: set for a run, with fork_start's
# CPU_ENV for the forked children, it says where the suite's CPU goes.
TEST_CPU_ENV = "ESTIMATOR_ACCUM_TEST_CPU"


def _cpu_seconds():
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime,
          children.ru_utime + children.ru_stime)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Tests marked `memory` or `grappler` (and their children) run
  TensorFlow's default Grappler, as users do (tests/helpers/grappler.py)."""
  del nextitem
  saved = os.environ.get(grappler.ENV)
  if item.get_closest_marker("memory") or item.get_closest_marker("grappler"):
    os.environ[grappler.ENV] = grappler.DEFAULT
  cpu_log = os.environ.get(TEST_CPU_ENV)
  before = _cpu_seconds() if cpu_log else None
  try:
    yield
  finally:
    if cpu_log:
      after = _cpu_seconds()
      with open(cpu_log, "a") as log:
        log.write(f"{after[0] - before[0]:.2f}\t{after[1] - before[1]:.2f}"
                  f"\t{item.nodeid}\n")
    if saved is None:
      os.environ.pop(grappler.ENV, None)
    else:
      os.environ[grappler.ENV] = saved
