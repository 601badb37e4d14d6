"""The shape of the library's code, read with `ast`: what a newcomer meets.

  .venv/bin/python benchmarks/code_shape.py [--root DIR]

Prints, for the package `estimator_accum` under DIR (default: this
repository): the largest class and function (lines), the attributes the
`Window` class sets, the places that branch on the reduction mode, the
places that list the window options, the modules that reach into
`tf.distribute` (and those importing TensorFlow's private modules), and the
files per folder. Run it on another checkout (`git worktree add`) to compare.
"""

import argparse
import ast
import collections
import pathlib
import sys

# The window options (those of `build_accumulating_train_op` besides the
# loss, the optimizer, k, global_step, var_list and num_examples).
OPTIONS = frozenset({
    "clip_norm", "reduction", "accumulator_dtype", "summaries", "loss_scale",
    "sparse_accumulation", "sparse_threshold_bytes", "communication_options",
    "after_update", "log_every_n_micro_batches",
    "max_consecutive_skipped_windows", "name"})
REDUCTION_MODES = frozenset({"mean", "sum", "running_mean"})
# State whose presence stands for a reduction mode: a test of it is a test
# of the mode (the weight exists unless summing, the divisor only for the
# plain mean).
MODE_STAND_INS = frozenset({"_weight", "_divisor", "_counts_micro_batches",
                            "holds_mean"})


def _modules(package):
  return sorted(p for p in package.rglob("*.py"))


def _span(node):
  return node.end_lineno - node.lineno + 1


def _names_reduction(node):
  """Whether an expression reads the reduction mode (a name or attribute
  called *reduction*, or a mode-object's `name`)."""
  for sub in ast.walk(node):
    if isinstance(sub, ast.Name) and "reduction" in sub.id:
      return True
    if isinstance(sub, ast.Attribute) and "reduction" in sub.attr:
      return True
  return False


def _is_mode_test(node):
  """A comparison of the reduction mode with one of its values, or a
  condition on state that stands for a mode."""
  if isinstance(node, (ast.If, ast.IfExp)):
    return any(isinstance(s, ast.Attribute) and s.attr in MODE_STAND_INS
               for s in ast.walk(node.test))
  if not isinstance(node, ast.Compare):
    return False
  sides = [node.left, *node.comparators]
  constants = {s.value for s in sides if isinstance(s, ast.Constant)}
  return bool(constants & REDUCTION_MODES) and any(
      _names_reduction(s) for s in sides)


def _option_lists(tree):
  """Function signatures, calls and class bodies that name 3 or more of
  the options one by one."""
  found = []
  for node in ast.walk(tree):
    names = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      arguments = node.args
      names = {a.arg for a in (arguments.args + arguments.kwonlyargs)}
    elif isinstance(node, ast.Call):
      names = {k.arg for k in node.keywords if k.arg}
    elif isinstance(node, ast.ClassDef):
      names = {t.target.id for t in node.body
               if isinstance(t, ast.AnnAssign) and
               isinstance(t.target, ast.Name)}
    if len(names & OPTIONS) >= 3:
      found.append(node)
  return found


def _window_attributes(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef) and node.name == "Window":
      attributes = set()
      for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
          attributes.add(sub.attr)
      methods = [b for b in node.body if isinstance(b, ast.FunctionDef)]
      return node, sorted(attributes), methods
  return None


def _distribute_use(tree):
  """(references to tf.distribute, imports of tensorflow.python.*)."""
  references, private = 0, []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr == "distribute"
        and isinstance(node.value, (ast.Name, ast.Attribute))):
      references += 1
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
        "tensorflow.python"):
      private.append(node.module)
    if isinstance(node, ast.Import):
      private += [a.name for a in node.names
                  if a.name.startswith("tensorflow.python")]
  return references, private


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=str(
      pathlib.Path(__file__).resolve().parent.parent))
  root = pathlib.Path(parser.parse_args().root)
  package = root / "estimator_accum"
  if not package.is_dir():
    print(f"code_shape: no estimator_accum/ under {root}", file=sys.stderr)
    return 1
  largest_class = largest_function = None
  mode_tests, option_lists = [], []
  distribute, private = {}, {}
  window = None
  folders = collections.Counter()
  for path in _modules(package):
    relative = path.relative_to(root)
    folders[str(relative.parent)] += 1
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      if isinstance(node, ast.ClassDef) and (
          largest_class is None or _span(node) > largest_class[0]):
        largest_class = (_span(node), f"{relative}:{node.name}")
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
          largest_function is None or _span(node) > largest_function[0]):
        largest_function = (_span(node), f"{relative}:{node.name}")
      if _is_mode_test(node):
        mode_tests.append(f"{relative}:{node.lineno}")
    option_lists += [f"{relative}:{n.lineno} "
                     f"({getattr(n, 'name', None) or 'call'})"
                     for n in _option_lists(tree)]
    references, imports = _distribute_use(tree)
    if references:
      distribute[str(relative)] = references
    if imports:
      private[str(relative)] = imports
    found = _window_attributes(tree)
    if found:
      window = (relative, *found)
  print(f"code shape of {package}")
  print(f"  largest class:     {largest_class[1]} ({largest_class[0]} lines)")
  print(f"  largest function:  {largest_function[1]} "
        f"({largest_function[0]} lines)")
  if window:
    relative, node, attributes, methods = window
    print(f"  Window ({relative}): {_span(node)} lines, {len(attributes)} "
          f"attributes, {len(methods)} methods")
    print(f"    attributes: {', '.join(attributes)}")
  print(f"  branches on the reduction mode: {len(mode_tests)}")
  for place in mode_tests:
    print(f"    {place}")
  print(f"  places that list the options (3 or more by name): "
        f"{len(option_lists)}")
  for place in option_lists:
    print(f"    {place}")
  print(f"  modules referring to tf.distribute: {len(distribute)}")
  for module, count in sorted(distribute.items()):
    print(f"    {module} ({count})")
  print(f"  modules importing tensorflow.python (private): {len(private)}")
  for module, imports in sorted(private.items()):
    print(f"    {module}: {', '.join(imports)}")
  print(f"  files per folder: {len(folders)} folders")
  for folder, count in sorted(folders.items()):
    print(f"    {folder}/ {count}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
