"""models.bert.classifier_run_dir.size: the bytes under a run directory,
where a file may go while they are counted."""

import os

from models.bert import classifier_run_dir


def test_size_counts_every_file_below(tmp_path):
  (tmp_path / "a").write_bytes(b"x" * 100)
  (tmp_path / "tmp_worker_1").mkdir()
  (tmp_path / "tmp_worker_1" / "b").write_bytes(b"x" * 20)
  assert classifier_run_dir.size(str(tmp_path)) == 120


def test_a_file_gone_while_counted_counts_nothing(tmp_path):
  # A CI run's chief failed with FileNotFoundError when a peer removed its
  # own save directory (tmp_worker_1) during the walk. A link whose target
  # is gone is a name the walk lists and getsize cannot read: the same.
  (tmp_path / "a").write_bytes(b"x" * 100)
  (tmp_path / "tmp_worker_1").mkdir()
  os.symlink(tmp_path / "tmp_worker_1" / "removed.index",
             tmp_path / "tmp_worker_1" / "model.ckpt-0.index")
  assert classifier_run_dir.size(str(tmp_path)) == 100
