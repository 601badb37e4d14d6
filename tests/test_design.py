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

ROOT = pathlib.Path(__file__).resolve().parent.parent
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


@pytest.mark.parametrize("module", [m for m in MODULES
                                    if not m.startswith(SEAM)])
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


def test_graph_state_refuses_another_module():
  with pytest.raises(RuntimeError, match="owned by"):
    graph_state.owned("progress", dict)


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
