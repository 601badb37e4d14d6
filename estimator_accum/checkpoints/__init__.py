"""The window in checkpoints: its state variables (`state_variables.py`),
the wrappers in object-based checkpoints (`object_checkpoints.py`), the
barrier before multi-worker saves (`ordered_saves.py`), and a saver hook
without the save of a run that has trained nothing (`saver_hook.py`)."""
