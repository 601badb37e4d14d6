"""BERT's WordPiece tokenizer with google-research/bert's public interface.

```python
tokenizer = tokenization.FullTokenizer("vocab.txt", do_lower_case=True)
tokens = tokenizer.tokenize("Hello, world!")   # ['hello', ',', 'world', '!']
ids = tokenizer.convert_tokens_to_ids(tokens)
```

The work is done by Hugging Face's `tokenizers` library (basic tokenization,
lower-casing and accent stripping, then greedy longest-match WordPiece), which
gives the same tokens as Google's reference code. `tokenize_batch` runs it over
many texts at once in native code, which is what feature conversion uses.
"""

import collections
import hashlib
import os

import tensorflow as tf
import tokenizers
from tokenizers import (
  BertWordPieceTokenizer,
  models,
  normalizers,
  pre_tokenizers,
)

# Tokens such as [CLS], [unused12] are not words; leave them out when deciding
# whether a vocabulary is cased.
_SPECIAL_PREFIX = "["


def convert_to_unicode(text):
  """str for str or UTF-8 bytes (google-research/bert's helper)."""
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  if isinstance(text, str):
    return text
  raise ValueError(f"text must be str or bytes, got {type(text).__name__}.")


printable_text = convert_to_unicode


def validate_case_matches_checkpoint(do_lower_case, init_checkpoint):
  """Google's check, done from the vocabulary: the vocab.txt beside the
  checkpoint, when there is one, must match do_lower_case."""
  if not init_checkpoint:
    return
  vocab_file = os.path.join(os.path.dirname(init_checkpoint), "vocab.txt")
  if tf.io.gfile.exists(vocab_file):
    validate_case_matches_vocab(do_lower_case, vocab_file)


def load_vocab(vocab_file):
  """Reads a vocab.txt (one token per line) into an ordered token → id map."""
  if not tf.io.gfile.exists(vocab_file):
    raise FileNotFoundError(f"vocab_file {vocab_file!r} does not exist.")
  vocab = collections.OrderedDict()
  with tf.io.gfile.GFile(vocab_file, "r") as reader:
    for index, line in enumerate(reader):
      token = line.rstrip("\n")
      if token in vocab:
        raise ValueError(f"{vocab_file}:{index + 1}: token {token!r} appears "
                         f"twice in the vocabulary.")
      vocab[token] = index
  if not vocab:
    raise ValueError(f"vocab_file {vocab_file!r} is empty.")
  return vocab


def vocab_is_cased(vocab):
  """True when the vocabulary has word pieces with capital letters."""
  return any(token[:1] != _SPECIAL_PREFIX and token != token.lower()
             for token in vocab)


def validate_case_matches_vocab(do_lower_case, vocab_file):
  """Raises ValueError when do_lower_case contradicts the vocabulary.

  An uncased vocabulary has no capital letters, so do_lower_case=False would
  turn every capitalized word into [UNK]; a cased one read with
  do_lower_case=True loses the case the model was trained with. Both train
  silently worse, so both are refused.
  """
  cased = vocab_is_cased(load_vocab(vocab_file))
  if do_lower_case and cased:
    raise ValueError(
        f"do_lower_case=True but vocab_file {vocab_file!r} is a cased "
        f"vocabulary (it has capital letters); pass do_lower_case=False.")
  if not do_lower_case and not cased:
    raise ValueError(
        f"do_lower_case=False but vocab_file {vocab_file!r} is an uncased "
        f"vocabulary (no capital letters); pass do_lower_case=True.")


def whitespace_tokenize(text):
  """Strips `text` and splits it on whitespace (Google's helper)."""
  return convert_to_unicode(text).split()


def convert_by_vocab(vocab, items):
  """Looks every item up in `vocab` (a dict), as Google's helper."""
  return [vocab[item] for item in items]


def convert_tokens_to_ids(vocab, tokens):
  return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab, ids):
  return convert_by_vocab(inv_vocab, ids)


class BasicTokenizer:
  """Splits on whitespace and punctuation, cleans the text, separates CJK
  characters and, with do_lower_case, lower-cases and strips accents:
  Google's BasicTokenizer, by Hugging Face's `tokenizers`."""

  def __init__(self, do_lower_case=True):
    self.do_lower_case = do_lower_case
    self._normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None,
        lowercase=do_lower_case)
    self._pre_tokenizer = pre_tokenizers.BertPreTokenizer()

  def tokenize(self, text):
    """list of str: the words and punctuation marks of `text`."""
    normalized = self._normalizer.normalize_str(convert_to_unicode(text))
    return [word for word, _ in
            self._pre_tokenizer.pre_tokenize_str(normalized)]


class WordpieceTokenizer:
  """Greedy longest-match-first WordPiece over whitespace-separated words
  (Google's WordpieceTokenizer); a word with no match, or longer than
  `max_input_chars_per_word`, becomes `unk_token`."""

  def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=200):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word
    self._model = models.WordPiece(
        dict(vocab), unk_token=unk_token,
        max_input_chars_per_word=max_input_chars_per_word)

  def tokenize(self, text):
    """list of str: the word pieces of the words of `text`."""
    return [token.value for word in whitespace_tokenize(text)
            for token in self._model.tokenize(word)]


class FullTokenizer:
  """Basic tokenization (punctuation, whitespace, case) followed by WordPiece."""

  def __init__(self, vocab_file, do_lower_case=True):
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {index: token for token, index in self.vocab.items()}
    self.do_lower_case = do_lower_case
    unk = "[UNK]" if "[UNK]" in self.vocab else None
    self._tokenizer = BertWordPieceTokenizer(
        dict(self.vocab), unk_token=unk or "[UNK]", clean_text=True,
        handle_chinese_chars=True, strip_accents=None,
        lowercase=do_lower_case)
    # Google's two stages, for scripts that call them directly.
    self.basic_tokenizer = BasicTokenizer(do_lower_case)
    self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, unk or "[UNK]")

  def identity(self):
    """What the tokens depend on: the vocabulary's digest, the case and the
    tokenizer library's version (a dict, for cache keys)."""
    vocabulary = hashlib.sha256("\n".join(
        sorted(self.vocab, key=self.vocab.get)).encode()).hexdigest()
    return {"vocab_sha256": vocabulary, "do_lower_case": self.do_lower_case,
            "tokenizers": tokenizers.__version__}

  def tokenize(self, text):
    """The word pieces of `text`, without [CLS]/[SEP]."""
    return self._tokenizer.encode(text, add_special_tokens=False).tokens

  def tokenize_batch(self, texts):
    """`tokenize` over a list of texts, in parallel native code."""
    encodings = self._tokenizer.encode_batch(list(texts),
                                             add_special_tokens=False)
    return [encoding.tokens for encoding in encodings]

  def convert_tokens_to_ids(self, tokens):
    try:
      return [self.vocab[token] for token in tokens]
    except KeyError as error:
      raise ValueError(f"token {error.args[0]!r} is not in the vocabulary."
                       ) from None

  def convert_ids_to_tokens(self, ids):
    return [self.inv_vocab[index] for index in ids]
