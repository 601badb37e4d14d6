"""Every relative link and every command the docs give points at something
that exists: a file, a `python -m` module, a `python path.py` script
(`your_*.py` stands for the user's own)."""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
MODULE = re.compile(r"python -m ([A-Za-z_][\w.]*)")
SCRIPT = re.compile(r"python ((?:[\w.-]+/)*[\w.-]+\.py)\b")
# A file of the repository named in backquotes: `benchmarks/window_ops.py`.
PATH = re.compile(r"`((?:benchmarks|tests|docs|models|data|tfconfig|"
                  r"estimator_accum)/[\w./-]+\.\w+)")


def _pages():
  return [pytest.param(page, id=str(page.relative_to(ROOT))) for page in PAGES]


@pytest.mark.parametrize("page", _pages())
def test_relative_links_exist(page):
  for target in LINK.findall(page.read_text()):
    if re.match(r"[a-z]+://", target):
      continue
    assert (page.parent / target).exists(), f"{page.name}: {target}"


@pytest.mark.parametrize("page", _pages())
def test_commands_name_modules_and_scripts_that_exist(page):
  text = page.read_text()
  for module in set(MODULE.findall(text)):
    if module in ("pytest", "pip", "venv"):
      continue
    assert importlib.util.find_spec(module) is not None, (
        f"{page.name}: python -m {module}")
  for script in set(SCRIPT.findall(text)):
    if script.startswith("your_"):  # A placeholder for the user's script.
      continue
    assert (ROOT / script).exists(), f"{page.name}: python {script}"
  for path in set(PATH.findall(text)):
    assert (ROOT / path).exists(), f"{page.name}: {path}"


def test_the_reference_is_written_from_the_code():
  """docs/reference.md is what `python -m harness.reference` writes (the
  public names, the window options' table, run_classifier's flags), the
  same on every release."""
  from harness import reference  # noqa: PLC0415

  expected = reference.render()
  assert (ROOT / "docs" / "reference.md").read_text() == expected, (
      "docs/reference.md is stale: python -m harness.reference > "
      "docs/reference.md")
