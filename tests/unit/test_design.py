"""The design as docs/design.md states it, checked against the code: every
module named exists and every module is named, one seam knows tf.distribute,
each piece of per-graph state has one owner, and no branch on the reduction
mode outside the reductions."""

import ast
import importlib
import pathlib
import re

import pytest

from estimator_accum import graph_state
from harness import code_facts

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "estimator_accum"
DESIGN = (ROOT / "docs" / "design.md").read_text()
MODULES = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py"))
SEAM = "estimator_accum/distribution/"


def test_every_module_is_named_in_the_design():
  named = set(re.findall(r"`(estimator_accum/[\w/]+\.py)`", DESIGN))
  missing = sorted(set(MODULES) - named)
  assert not missing, f"docs/design.md does not name {missing}"


def test_every_module_the_design_names_exists():
  named = set(re.findall(r"`(estimator_accum/[\w/]+\.py)`", DESIGN))
  ghosts = sorted(named - set(MODULES))
  assert not ghosts, f"docs/design.md names modules that do not exist: {ghosts}"
  # Dotted names too: `estimator_accum.x.y` must import.
  for dotted in set(re.findall(r"`(estimator_accum(?:\.\w+)+)`", DESIGN)):
    importlib.import_module(dotted)


def test_every_folder_is_named_in_the_design():
  folders = {str(p.relative_to(ROOT)) + "/" for p in PACKAGE.iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
  for folder in folders:
    assert f"`{folder}`" in DESIGN, folder


def _tree(module):
  return ast.parse((ROOT / module).read_text(), module)


# The doors to private TensorFlow and private Keras.
DOORS = ("estimator_accum/tf_private.py", "estimator_accum/runtime_private.py",
         "estimator_accum/keras_private.py")


# tf_private.py is the door to private TensorFlow, distribution's included;
# only the seam calls its distribution functions (below).
@pytest.mark.parametrize("module", [m for m in MODULES
                                    if not m.startswith(SEAM) and
                                    m not in DOORS])
def test_only_the_seam_knows_tf_distribute(module):
  for node in ast.walk(_tree(module)):
    if isinstance(node, ast.Attribute) and node.attr == "distribute":
      pytest.fail(f"{module}:{node.lineno} refers to tf.distribute; ask "
                  f"{SEAM} instead")
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
        "tensorflow.python.distribute"):
      pytest.fail(f"{module}:{node.lineno} imports {node.module}")


def test_each_graph_state_entry_is_asked_for_by_its_owner_only():
  asked = {}
  for module in MODULES:
    for node in ast.walk(_tree(module)):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "owned" and node.args and
          isinstance(node.args[0], ast.Constant)):
        asked.setdefault(node.args[0].value, set()).add(module)
  for key, (owner, _) in graph_state.OWNERS.items():
    path = owner.replace(".", "/") + ".py"
    assert asked.get(key) == {path}, (key, asked.get(key))
    assert f"`{key}`" in DESIGN and f"`{path}`" in DESIGN, key
  assert set(asked) == set(graph_state.OWNERS)


def test_graph_state_refuses_a_key_with_no_owner():
  with pytest.raises(KeyError, match="no owner"):
    graph_state.owned("progress_of_someone_else", dict)


@pytest.mark.parametrize("module", [m for m in MODULES
                                    if m != "estimator_accum/options.py" and
                                    m != "estimator_accum/window/reductions.py"])
def test_no_branch_on_the_reduction_mode_outside_the_reductions(module):
  modes = {"mean", "sum", "running_mean"}
  for node in ast.walk(_tree(module)):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      values = {s.value for s in sides if isinstance(s, ast.Constant)}
      reads_mode = any("reduction" in getattr(sub, "id", "") or
                       "reduction" in getattr(sub, "attr", "")
                       for s in sides for sub in ast.walk(s))
      assert not (values & modes and reads_mode), f"{module}:{node.lineno}"


def test_nothing_is_written_into_another_objects_dict():
  for module in MODULES:
    text = (ROOT / module).read_text()
    assert ".__dict__[" not in text and "__dict__.setdefault" not in text, (
        module)


LIBRARY = sorted(str(p.relative_to(ROOT)) for folder in ("estimator_accum",
                                                         "tfconfig")
                 for p in (ROOT / folder).rglob("*.py"))
@pytest.mark.parametrize("module", [m for m in LIBRARY if m not in DOORS])
def test_private_tensorflow_only_through_the_door(module):
  text = (ROOT / module).read_text()
  found = [f"{module}:{line} {what}"
           for line, what in code_facts.private_accesses(
               ast.parse(text, module))]
  # A module's own private names (`module._helper`) are not TensorFlow's,
  # but the library uses none across modules either: any is reported.
  assert not found, (
      f"private TensorFlow outside {' and '.join(DOORS)}: {found}; add a "
      f"named function there (with the version it was written for and why "
      f"no public API serves) and call it")
  assert "noqa: SLF001" not in text, module


@pytest.mark.parametrize("door", DOORS)
def test_the_door_is_used_and_its_test_covers_each_function(door):
  tree = ast.parse((ROOT / door).read_text())
  functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
               and not n.name.startswith("_")]
  assert functions, door
  module = door.rsplit("/", 1)[-1][:-len(".py")]
  tested = (ROOT / "tests" / "unit" / "test_tf_private.py").read_text()
  untested = [f for f in functions if f"{module}.{f}(" not in tested]
  assert not untested, f"tests/unit/test_tf_private.py does not run {untested}"
  for function in functions:
    doc = ast.get_docstring(next(n for n in tree.body if getattr(
        n, "name", None) == function))
    assert doc and ("._" in doc or "`_" in doc or "tensorflow.python" in doc
                    or "keras.src" in doc), (
        function)  # names what it reaches for


# Guardrails, so that the core stays small: every line of a class or a
# function counts, its docstrings too (`code_lines` also reports the lines
# without them, as benchmarks/code_shape.py does).
MAX_CLASS_LINES = 200
MAX_FUNCTION_LINES = 80


def _docstring_lines(node):
  body = getattr(node, "body", None)
  if (body and isinstance(body[0], ast.Expr) and
      isinstance(body[0].value, ast.Constant) and
      isinstance(body[0].value.value, str)):
    return body[0].end_lineno - body[0].lineno + 1
  return 0


def code_lines(node):
  """Lines of `node` (a class or function), less its docstrings and those
  of what it defines."""
  docs = sum(_docstring_lines(n) for n in ast.walk(node)
             if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                               ast.AsyncFunctionDef)))
  return node.end_lineno - node.lineno + 1 - docs


def lines(node):
  """Every line of `node`, from its `def` or `class` to its last."""
  return node.end_lineno - node.lineno + 1


def _definitions(kind):
  for module in LIBRARY:
    for node in ast.walk(_tree(module)):
      if isinstance(node, kind):
        yield module, node


def test_no_class_passes_200_lines():
  large = [f"{m}:{n.name} {lines(n)}" for m, n in
           _definitions(ast.ClassDef) if lines(n) > MAX_CLASS_LINES]
  assert not large, f"classes over {MAX_CLASS_LINES} lines: {large}"


def test_no_function_passes_80_lines():
  large = [f"{m}:{n.name} {lines(n)}" for m, n in
           _definitions((ast.FunctionDef, ast.AsyncFunctionDef))
           if lines(n) > MAX_FUNCTION_LINES]
  assert not large, f"functions over {MAX_FUNCTION_LINES} lines: {large}"


def import_graph():
  """{library module: the library modules it imports}
  (`harness.code_facts.imports`)."""
  names = {code_facts.module_name(m): m for m in LIBRARY}
  return {name: sorted(code_facts.imports(_tree(path), names) - {name})
          for name, path in names.items()}


def test_no_import_cycle():
  graph = import_graph()
  state = {}

  def visit(module, path):
    state[module] = "open"
    for imported in graph[module]:
      if state.get(imported) == "open":
        cycle = path[path.index(imported):] + [imported]
        pytest.fail("import cycle: " + " -> ".join(cycle))
      if imported not in state:
        visit(imported, path + [imported])
    state[module] = "done"

  for module in graph:
    if module not in state:
      visit(module, [module])


def test_the_guardrails_see_what_they_guard():
  # Each check finds what it looks for in a made-up module.
  tree = ast.parse("class A:\n" + "  x = 1\n" * 201 +
                   "def f():\n  '''doc\n  doc'''\n" + "  y = 2\n" * 81)
  classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
  functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
  assert lines(classes[0]) == 202 and lines(functions[0]) == 84
  assert code_lines(functions[0]) == 82
  assert import_graph()["estimator_accum.window.window"]


def test_window_settings_has_a_field_per_option_with_the_tables_default():
  import dataclasses

  from estimator_accum.options import OPTIONS, WindowSettings
  fields = [f for f in dataclasses.fields(WindowSettings)
            if f.name not in ("k", "gradient_options")]
  assert [f.name for f in fields] == [o.name for o in OPTIONS]
  for field, option in zip(fields, OPTIONS):
    assert field.default == option.default, field.name


def _imports_of(path):
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.lineno, node.module
    elif isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name


@pytest.mark.parametrize("folder, other", [("tests", "benchmarks"),
                                           ("benchmarks", "tests"),
                                           ("harness", "tests"),
                                           ("harness", "benchmarks")])
def test_tests_and_benchmarks_never_import_each_other(folder, other):
  # What both need lives in harness/, which imports neither.
  found = [f"{p.relative_to(ROOT)}:{line} imports {module}"
           for p in (ROOT / folder).rglob("*.py")
           for line, module in _imports_of(p)
           if module == other or module.startswith(other + ".")]
  assert not found, found


# Benchmark scripts another script starts, which print no figures of their
# own (their parent does).
# Jobs the benchmarks start (in another process, or another venv).
BENCHMARK_JOBS = {"recipe_worker.py", "peer_hf_trainer.py"}


def test_every_benchmark_script_runs_on_the_one_harness():
  # Its command line from bench.parser (--json for every script), its
  # figures through bench.Rows (one table form, JSON rows, an exit code).
  scripts = {p.name: p.read_text() for p in (ROOT / "benchmarks").glob("*.py")
             if "__main__" in p.read_text()}
  assert len(scripts) > 20 and BENCHMARK_JOBS <= set(scripts)
  own_parser = sorted(name for name, text in scripts.items()
                      if "ArgumentParser(" in text and
                      name not in BENCHMARK_JOBS)
  assert not own_parser, f"parse their own arguments: {own_parser}"
  off_harness = sorted(
      name for name, text in scripts.items() if name not in BENCHMARK_JOBS
      and not ("bench.parser(" in text and "bench.Rows(" in text))
  assert not off_harness, f"not on harness.bench: {off_harness}"
  started = "\n".join(scripts.values())
  assert all(job in started.replace(f"benchmarks/{job}", job)
             for job in BENCHMARK_JOBS)


def test_the_tests_mirror_the_code():
  # Unit tests per package of the library, whole jobs under integration/,
  # the scripts tests start under jobs/, no test module at the top.
  tests = ROOT / "tests"
  assert not list(tests.glob("test_*.py"))
  packages = {p.name for p in PACKAGE.iterdir()
              if (p / "__init__.py").exists()}
  unit = {p.name for p in (tests / "unit").iterdir() if p.is_dir() and
          (p / "__init__.py").exists()}
  assert {"window", "checkpoints", "integrations", "planning",
          "memory"} <= unit <= packages | {"models", "launcher"}
  assert list((tests / "integration").glob("test_*.py"))
  assert not list((tests / "jobs").glob("test_*.py"))


def _imported(path, top_level_only=False):
  """The top-level package of everything `path` imports (anywhere in it, or
  in its module-level statements only)."""
  tree = ast.parse(path.read_text(), str(path))
  nodes = tree.body if top_level_only else ast.walk(tree)
  names = set()
  for node in nodes:
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names.add((node.module or "").split(".")[0])
  return names


@pytest.mark.parametrize("package, refused, refused_at_import", [
    # The library stands on its own: it imports nothing of the launcher.
    ("estimator_accum", {"tfconfig"}, set()),
    # What both agree on (TF_CONFIG, the health markers) is pure Python.
    ("clusterspec", {"tfconfig", "estimator_accum", "tensorflow"}, set()),
    # The launcher uses neither the library nor, when it is imported,
    # TensorFlow (a task reading Slurm's variables loads it there).
    ("tfconfig", {"estimator_accum"}, {"tensorflow"}),
])
def test_one_direction_between_the_library_and_the_launcher(
    package, refused, refused_at_import):
  for path in sorted((ROOT / package).rglob("*.py")):
    wrong = (_imported(path) & refused) | (
        _imported(path, top_level_only=True) & refused_at_import)
    assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
