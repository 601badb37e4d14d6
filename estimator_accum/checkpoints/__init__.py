"""The window in checkpoints: its state variables (`state_variables.py`),
the wrappers in object-based checkpoints (`object_checkpoints.py`), and the
barrier before multi-worker saves (`ordered_saves.py`)."""
