"""Outside the training step: the micro-batch chosen from measured memory
(`planner.py`) and going on with half of it after running out (`replan.py`)."""
