"""The shape of the library's code, read with `ast`: what a newcomer meets.

  .venv/bin/python benchmarks/code_shape.py [--root DIR] [--write FILE]
      [--block NAME]

Prints, for the checkout at DIR (default: this repository): the largest
class and function (lines, and lines of code without docstrings), the
attributes and methods of the window's parts, the library modules each
library module is imported by (and imports), the modules touching private
TensorFlow, the places that list 3 or more window options by name (the
options read from the checkout's own option table), and the files per
folder of the library, tests/ and benchmarks/. Run it on another checkout
(`git worktree add`) to compare.

With --write FILE, the figures also replace the block between
`<!-- code-shape-NAME:start -->` and `<!-- code-shape-NAME:end -->` in FILE
(NAME from --block, default "current"): the docs quote what this script
measured, never typed figures. Reads the source
only; imports nothing of it.
"""

import ast
import collections
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from harness import bench, code_facts  # noqa: E402

# The window's parts: the classes that make one window's graph.
WINDOW_PARTS = ("Window", "Accumulation", "Communication", "Finish",
                "OptimizerApply", "Bookkeeping")
LIBRARY = ("estimator_accum", "tfconfig")


def _span(node):
  return node.end_lineno - node.lineno + 1


def _code_lines(node):
  """Lines less the docstrings of `node` and of what it defines."""
  docs = 0
  for sub in ast.walk(node):
    body = getattr(sub, "body", None)
    if (isinstance(sub, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body and isinstance(body[0], ast.Expr) and
        isinstance(body[0].value, ast.Constant) and
        isinstance(body[0].value.value, str)):
      docs += _span(body[0])
  return _span(node) - docs


def _option_names(root):
  """The window options, from the checkout's table: the first argument of
  each `Option(...)` in estimator_accum/options.py."""
  tree = ast.parse((root / "estimator_accum" / "options.py").read_text())
  return [n.args[0].value for n in ast.walk(tree)
          if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Option"
          and n.args and isinstance(n.args[0], ast.Constant)]


def _option_lists(tree, options):
  """Signatures and calls that name 3 or more of the options one by one
  (the table itself and the one settings class are the list, not a copy)."""
  found = []
  for node in ast.walk(tree):
    names = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      arguments = node.args
      names = {a.arg for a in (arguments.args + arguments.kwonlyargs)}
    elif isinstance(node, ast.Call):
      names = {k.arg for k in node.keywords if k.arg}
    if len(names & options) >= 3:
      found.append(f"{node.lineno} ({getattr(node, 'name', 'call')})")
  return found


def _parts(tree):
  """{part: (lines, attributes, methods)} of the window's parts in `tree`."""
  parts = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef) and node.name in WINDOW_PARTS:
      attributes = {sub.attr for sub in ast.walk(node)
                    if isinstance(sub, ast.Attribute) and
                    isinstance(sub.ctx, ast.Store) and
                    isinstance(sub.value, ast.Name) and sub.value.id == "self"}
      methods = [b.name for b in node.body if isinstance(b, ast.FunctionDef)]
      parts[node.name] = (_span(node), sorted(attributes), methods)
  return parts


def measure(root):
  """The figures of the checkout at `root`, as a dict."""
  options = set(_option_names(root))
  modules = sorted(p for folder in LIBRARY for p in (root / folder).rglob(
      "*.py"))
  trees = {p.relative_to(root): ast.parse(p.read_text(), str(p))
           for p in modules}
  names = {code_facts.module_name(r): r for r in trees}
  shape = {"classes": [], "functions": [], "parts": {}, "private": {},
           "option_lists": [], "imports": {}}
  for relative, tree in trees.items():
    for node in ast.walk(tree):
      if isinstance(node, ast.ClassDef):
        shape["classes"].append((_span(node), _code_lines(node),
                                 f"{relative}:{node.name}"))
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        shape["functions"].append((_span(node), _code_lines(node),
                                   f"{relative}:{node.name}"))
    for part, figures in _parts(tree).items():
      shape["parts"][part] = (str(relative), *figures)
    private = [what.lstrip(".").replace("import ", "")
               for _, what in code_facts.private_accesses(tree)]
    if private:
      shape["private"][str(relative)] = sorted(set(private))
    shape["option_lists"] += [f"{relative}:{place}"
                              for place in _option_lists(tree, options)]
    shape["imports"][code_facts.module_name(relative)] = code_facts.imports(
        tree, names) - {code_facts.module_name(relative)}
  importers = collections.defaultdict(set)
  for module, imported in shape["imports"].items():
    for other in imported:
      importers[other].add(module)
  shape["importers"] = {m: sorted(importers[m]) for m in names}
  shape["folders"] = collections.Counter()
  for folder in ("estimator_accum", "tests", "benchmarks", "harness"):
    for path in (root / folder).rglob("*"):
      if path.is_file() and "__pycache__" not in path.parts:
        shape["folders"][str(path.parent.relative_to(root)) + "/"] += 1
  shape["options"] = len(options)
  return shape


def report(shape, root):
  """The figures as lines of text."""
  lines = [f"code shape of {root}"]
  for kind in ("classes", "functions"):
    span, code, where = max(shape[kind])
    by_code = max(shape[kind], key=lambda item: item[1])
    lines.append(f"  largest {kind[:-2] if kind == 'classes' else kind[:-1]}"
                 f": {where} ({span} lines); most code: {by_code[2]} "
                 f"({by_code[1]} lines without docstrings)")
  lines.append(f"  the window's parts ({len(shape['parts'])}):")
  for part in WINDOW_PARTS:
    if part in shape["parts"]:
      module, span, attributes, methods = shape["parts"][part]
      lines.append(f"    {part} ({module}): {span} lines, {len(attributes)} "
                   f"attributes, {len(methods)} methods")
      lines.append(f"      attributes: {', '.join(attributes)}")
      lines.append(f"      methods: {', '.join(methods)}")
  fan_out = sorted(((len(v), m) for m, v in shape["imports"].items()
                    if m.startswith("estimator_accum")), reverse=True)
  lines.append("  library modules importing the most library modules: " +
               ", ".join(f"{m} {n}" for n, m in fan_out[:4]))
  lines.append("  library modules imported by (count, importers):")
  for module, importers in sorted(shape["importers"].items(),
                                  key=lambda item: (-len(item[1]), item[0])):
    if importers:
      lines.append(f"    {module}: {len(importers)}")
  lines.append(f"  modules touching private TensorFlow: "
               f"{len(shape['private'])}")
  for module, names in sorted(shape["private"].items()):
    lines.append(f"    {module}: {', '.join(names)}")
  lines.append(f"  places that list 3 or more of the {shape['options']} "
               f"options by name: {len(shape['option_lists'])}")
  lines += [f"    {place}" for place in shape["option_lists"]]
  lines.append("  files per folder:")
  for folder, count in sorted(shape["folders"].items()):
    lines.append(f"    {folder} {count}")
  return lines


def write(path, lines, root_label, block):
  """Replaces the code-shape block `block` of the file at `path` with
  `lines`."""
  text = pathlib.Path(path).read_text()
  start = f"<!-- code-shape-{block}:start -->"
  end = f"<!-- code-shape-{block}:end -->"
  if start not in text or end not in text:
    raise SystemExit(f"code_shape: {path} has no {start} ... {end} block")
  command = f"benchmarks/code_shape.py --write {path} --block {block}"
  block = "\n".join([start, "", f"Written by `{command}` ({root_label}):",
                     "", "```text", *lines, "```", "", end])
  pattern = re.escape(start) + ".*?" + re.escape(end)
  pathlib.Path(path).write_text(
      re.sub(pattern, lambda _: block, text, flags=re.S))


def _rows(shape, json_path):
  """The headline figures as result rows (--json), the report being the
  printed table."""
  rows = bench.Rows("code shape", json_path)
  for kind in ("classes", "functions"):
    span, code, where = max(shape[kind])
    rows.add(figure=f"largest of {kind}", where=where, lines=span)
  for part, (module, span, attributes, methods) in shape["parts"].items():
    rows.add(figure="window part", where=f"{module}:{part}", lines=span,
             attributes=len(attributes), methods=len(methods))
  rows.add(figure="modules touching private TensorFlow",
           value=len(shape["private"]))
  rows.add(figure="places listing 3 or more options",
           value=len(shape["option_lists"]))


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--root", default=str(
      pathlib.Path(__file__).resolve().parent.parent))
  parser.add_argument("--write", metavar="FILE",
                      help="also write the figures into FILE's code-shape "
                      "block")
  parser.add_argument("--block", default="current",
                      help="the block's name in FILE (default current)")
  arguments = parser.parse_args()
  root = pathlib.Path(arguments.root)
  if not (root / "estimator_accum" / "options.py").is_file():
    print(f"code_shape: no estimator_accum/options.py under {root}",
          file=sys.stderr)
    return 1
  shape = measure(root)
  lines = report(shape, root)
  print("\n".join(lines))
  if arguments.json:
    _rows(shape, arguments.json)
  if arguments.write:
    label = "this checkout"
    if (root / ".git").exists():
      label = "commit " + subprocess.run(
          ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
          capture_output=True, text=True, check=False).stdout.strip()
    write(arguments.write, [line.replace(str(root), ".") for line in lines],
          label, arguments.block)
  return 0


if __name__ == "__main__":
  sys.exit(main())
