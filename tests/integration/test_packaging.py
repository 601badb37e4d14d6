"""`pip install .` installs the library and tfconfig, with only what they
import; the scripts' needs are the `examples` extra."""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_library_and_tfconfig_only(tmp_path):
  # Built from a copy: a build in the checkout leaves build/ behind.
  source = tmp_path / "source"
  shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
      ".venv", ".git", "build", "*.egg-info", "__pycache__", "runs"))
  subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
       "--no-build-isolation", "--wheel-dir", str(tmp_path), str(source)],
      check=True, capture_output=True, text=True, timeout=300)
  wheel, = tmp_path.glob("estimator_accum-*.whl")
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    metadata = archive.read(next(n for n in names
                                 if n.endswith("/METADATA"))).decode()
  top = {name.split("/")[0] for name in names}
  assert {t for t in top if not t.endswith(".dist-info")} == {
      "estimator_accum", "tfconfig"}, top
  requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
              if line.startswith("Requires-Dist:")]
  core = sorted(r for r in requires if "extra ==" not in r)
  assert core == ["PyYAML==6.0.3", "absl-py==2.1.0", "numpy==1.26.4",
                  "tensorflow-cpu==2.15.1", "tensorflow-estimator==2.15.0"
                  ], core
  examples = [r for r in requires if 'extra == "examples"' in r]
  assert any(r.startswith("tokenizers") for r in examples), examples
