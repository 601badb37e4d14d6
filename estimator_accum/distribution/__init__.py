"""The one place that knows `tf.distribute` (filled in below)."""
