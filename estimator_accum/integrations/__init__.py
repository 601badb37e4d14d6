"""Accumulation for code that calls an optimizer itself (`optimizer.py`,
`keras_optimizer.py`, sharing `wrappers.py`), and the Estimator hook
(`hooks.py`)."""
