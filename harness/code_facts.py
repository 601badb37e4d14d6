"""Facts read from source with `ast`, one definition for the design tests
(tests/unit/test_design.py) and the shape they report
(benchmarks/code_shape.py): what counts as reaching into TensorFlow's
private API, a module's dotted name, and the library modules it imports."""

import ast

# Names that start with "_" and are public: a namedtuple's methods, os._exit.
PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_exit"}
_REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def private_accesses(tree):
  """(line, what) of each reach past a public name in `tree`: an attribute
  `x._name` of anything but `self`, `cls` or `super()`; getattr & co. with
  a private name; a `tensorflow.python`, `tensorflow.tsl` or `keras.src` import."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and (
        not node.attr.startswith("__")) and node.attr not in PUBLIC:
      value = node.value
      if isinstance(value, ast.Name) and value.id in ("self", "cls"):
        continue
      if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
          and value.func.id == "super"):
        continue
      yield node.lineno, f".{node.attr}"
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
          node.func.id in _REFLECTION and len(node.args) > 1 and
          isinstance(node.args[1], ast.Constant) and
          str(node.args[1].value).startswith("_") and
          not str(node.args[1].value).startswith("__")):
      yield node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
               [a.name for a in node.names])
      for name in names:
        if name.startswith(("tensorflow.python", "tensorflow.tsl",
                            "keras.src")):
          yield node.lineno, f"import {name}"


def module_name(path):
  """The dotted name of the module at relative `path` ("a/b.py" -> "a.b";
  a package's __init__.py -> the package)."""
  name = str(path)[:-3].replace("/", ".")
  return name[:-len(".__init__")] if name.endswith(".__init__") else name


def imports(tree, names):
  """The modules of `names` that `tree` imports, a `from p import m` of a
  submodule counted as that submodule's import."""
  imported = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        imported.add(full if full in names else node.module)
    elif isinstance(node, ast.Import):
      imported.update(a.name for a in node.names)
  return imported & set(names)
