"""What ends a run_classifier.py run early, each as one line and an exit
code: 1 for bad flags or inputs, 3 for a diverged run, 4 for an
--output_dir whose checkpoints are all incomplete
(models.training.NO_COMPLETE_CHECKPOINT_EXIT_CODE), 5 for a full disk
(models.training.DISK_FULL_EXIT_CODE)."""

DIVERGED_EXIT_CODE = 3


class UsageError(ValueError):
  """Bad flags or inputs: reported as one line and a non-zero exit."""


class NotFinite(RuntimeError):
  """Training or evaluation diverged: one line and exit code 3."""


class DiskFull(RuntimeError):
  """A write (a checkpoint, an export) found the disk full: one line,
  exit 5."""
