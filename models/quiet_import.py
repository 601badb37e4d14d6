"""Imported first by the scripts: loads TensorFlow with the lines
TensorFlow 2.16+ writes while it loads held back, the ones that say
something written after (`console.import_tensorflow`)."""

from models import console

console.import_tensorflow()
