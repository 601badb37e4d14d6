"""Every Python block of the README and docs/ that is a whole program (it
imports TensorFlow and the library and leaves nothing out as `...`) runs
as a user would copy it: in a fresh directory, exit 0. On TensorFlow 2.15
and 2.21 (CI's two ends) alike."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def is_program(block):
  return (re.search(r"^import tensorflow as tf$", block, re.M) is not None
          and re.search(r"^(import|from) estimator_accum", block, re.M)
          is not None and "..." not in block)


def _programs():
  found = []
  for page in PAGES:
    blocks = [b for b in BLOCK.findall(page.read_text()) if is_program(b)]
    found += [pytest.param(block, id=f"{page.relative_to(ROOT)}:{index}")
              for index, block in enumerate(blocks)]
  return found


def test_the_readme_and_the_guide_have_programs():
  ids = [p.id for p in _programs()]
  assert sum(i.startswith("README.md") for i in ids) == 2, ids
  assert any(i.startswith("docs/user_guide.md") for i in ids), ids


@pytest.mark.parametrize("program", _programs())
def test_the_program_runs(program, tmp_path):
  (tmp_path / "example.py").write_text(program)
  result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
