"""TensorFlow's `saved_model_cli`, with TensorFlow Text's ops registered.

  python -m models.bert.saved_model_cli run --dir EXPORT/VERSION \\
      --tag_set serve --signature_def text --input_exprs 'text=["a fine film"]'

The exported classifier's `text` signature tokenizes with TensorFlow Text,
whose ops are not TensorFlow's own: a process that loads the SavedModel
(even for its `serving_default` signature, the graph being one) imports
`tensorflow_text` first. This is TensorFlow's own command line, run after
that import; TensorFlow Serving's model server links the same ops in.
"""

import sys

import tensorflow_text  # noqa: F401 (registers TensorFlow Text's ops)
from tensorflow.python.tools import saved_model_cli


def main():
  sys.argv[0] = "saved_model_cli"
  return saved_model_cli.main()


if __name__ == "__main__":
  sys.exit(main())
