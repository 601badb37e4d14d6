"""Keeps AutoGraph out of the library's graph building.

MirroredStrategy and MultiWorkerMirroredStrategy run a model_fn through
AutoGraph even in graph mode (`call_for_each_replica` converts what it
calls), and AutoGraph converts, recursively, every function the model_fn
calls that is not TensorFlow's own: the library's too, and the Python logging
it calls (whose conversion failed under pytest's log handlers and left the
graph referenced by the failure's record). The library builds its control
flow with `tf.cond` itself, so its entry points run as written.
"""

import tensorflow as tf

# Decorator for the functions and methods a model_fn calls.
as_written = tf.autograph.experimental.do_not_convert
