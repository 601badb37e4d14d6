"""Checkpoint conversion and tokenization against independent references:
the real all-MiniLM-L6-v2 (numpy forward pass from its safetensors; its own
tokenizer.json), and small random folders written here."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from harness.texts import SENTENCES  # checked with transformers there
from models.bert import convert_hf, modeling, pretrained, tokenization
from tests.helpers import bert_fixtures, bert_numpy_reference

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
  return pretrained.minilm_checkpoint(str(tmp_path_factory.mktemp("cache")))


def _encode(tokenizer, texts, length):
  ids = np.zeros((len(texts), length), np.int32)
  mask = np.zeros_like(ids)
  for row, text in enumerate(texts):
    tokens = ["[CLS]"] + tokenizer.tokenize(text)[:length - 2] + ["[SEP]"]
    ids[row, :len(tokens)] = tokenizer.convert_tokens_to_ids(tokens)
    mask[row, :len(tokens)] = 1
  return ids, mask


def _forward(bert_config_file, init_checkpoint, ids, mask, types):
  with tf.Graph().as_default():
    model = modeling.BertModel(
        modeling.BertConfig.from_json_file(bert_config_file), False,
        tf.constant(ids), tf.constant(mask), tf.constant(types))
    tf.compat.v1.train.init_from_checkpoint(init_checkpoint, {"bert/": "bert/"})
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run([model.get_sequence_output(),
                          model.get_pooled_output()])


def test_tokenizer_gives_the_reference_ids(minilm):
  tokenizer = tokenization.FullTokenizer(minilm.vocab_file, True)
  reference = Tokenizer.from_file(
      os.path.join(pretrained.minilm_hf_dir(), "tokenizer.json"))
  reference.no_padding()
  reference.no_truncation()
  for text in SENTENCES:
    ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))
    assert [101] + ids + [102] == reference.encode(text).ids, text
  assert tokenizer.tokenize("Hello, world!") == ["hello", ",", "world", "!"]
  assert tokenizer.convert_tokens_to_ids(["hello", "world"]) == [7592, 2088]
  assert tokenizer.tokenize_batch(SENTENCES[:2]) == [
      tokenizer.tokenize(text) for text in SENTENCES[:2]]


def test_converted_minilm_reproduces_hugging_face_hidden_states(minilm):
  hf_dir = pretrained.minilm_hf_dir()
  with open(os.path.join(hf_dir, "config.json")) as reader:
    config = json.load(reader)
  tokenizer = tokenization.FullTokenizer(minilm.vocab_file, True)
  ids, mask = _encode(tokenizer, SENTENCES, 24)
  types = np.zeros_like(ids)
  types[:, 12:] = 1 * mask[:, 12:]
  sequence, pooled = _forward(minilm.bert_config_file,
                              minilm.init_checkpoint, ids, mask, types)
  expected_sequence, expected_pooled = bert_numpy_reference.bert_hidden_states(
      load_file(os.path.join(hf_dir, "model.safetensors")), config, ids,
      mask.astype(np.float64), types)
  np.testing.assert_allclose(sequence, expected_sequence, atol=1e-4, rtol=0)
  np.testing.assert_allclose(pooled, expected_pooled, atol=1e-4, rtol=0)
  assert np.abs(expected_sequence).max() > 1.0  # Not a trivial comparison.


def test_convert_hf_command_line_on_a_random_folder(tmp_path):
  config, weights = bert_fixtures.write_tiny_hf_bert(str(tmp_path / "hf"))
  subprocess.run(
      [sys.executable, "-m", "models.bert.convert_hf",
       "--model_dir", str(tmp_path / "hf"), "--output_dir",
       str(tmp_path / "out")], check=True, capture_output=True)
  prefix = str(tmp_path / "out" / "bert_model.ckpt")
  reader = tf.train.load_checkpoint(prefix)
  kernel = reader.get_tensor("bert/encoder/layer_1/intermediate/dense/kernel")
  np.testing.assert_array_equal(
      kernel, weights["encoder.layer.1.intermediate.dense.weight"].T)
  np.testing.assert_array_equal(
      reader.get_tensor("bert/encoder/layer_0/attention/output/LayerNorm/"
                        "gamma"),
      weights["encoder.layer.0.attention.output.LayerNorm.weight"])
  names = set(reader.get_variable_to_shape_map())
  assert len(names) == 5 + 2 + 16 * 2  # embeddings, pooler, 16 per layer.
  bert_config = modeling.BertConfig.from_json_file(
      str(tmp_path / "out" / "bert_config.json"))
  assert bert_config.hidden_size == 16
  ids = np.array([[2, 7, 9, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  sequence, _ = _forward(str(tmp_path / "out" / "bert_config.json"), prefix,
                         ids, mask, np.zeros_like(ids))
  expected, _ = bert_numpy_reference.bert_hidden_states(
      weights, config, ids, mask.astype(np.float64), np.zeros_like(ids))
  np.testing.assert_allclose(sequence, expected, atol=1e-5)


def test_convert_hf_refuses_unknown_weights_and_missing_files(tmp_path):
  bert_fixtures.write_tiny_hf_bert(str(tmp_path))
  path = str(tmp_path / "model.safetensors")
  weights = load_file(path)
  weights["encoder.layer.0.adapter.weight"] = np.zeros(3, np.float32)
  save_file(weights, path)
  with pytest.raises(ValueError, match="encoder.layer.0.adapter.weight"):
    convert_hf.convert(str(tmp_path), str(tmp_path / "out"))
  os.remove(path)
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    convert_hf.convert(str(tmp_path), str(tmp_path / "out"))
  result = subprocess.run(
      [sys.executable, "-m", "models.bert.convert_hf", "--model_dir",
       str(tmp_path), "--output_dir", str(tmp_path / "out")],
      capture_output=True, text=True)
  assert result.returncode != 0
  assert "has no model.safetensors" in result.stderr.strip().splitlines()[-1]


def test_do_lower_case_must_match_the_vocabulary(minilm, tmp_path):
  with pytest.raises(ValueError, match="do_lower_case=False.*uncased"):
    tokenization.validate_case_matches_vocab(False, minilm.vocab_file)
  cased = tmp_path / "cased.txt"
  cased.write_text("[PAD]\n[UNK]\nThe\nthe\nFilm\n")
  with pytest.raises(ValueError, match="do_lower_case=True.*cased"):
    tokenization.validate_case_matches_vocab(True, str(cased))
  tokenization.validate_case_matches_vocab(False, str(cased))
  tokenization.validate_case_matches_vocab(True, minilm.vocab_file)


def test_float16_compute_keeps_float32_variables_and_outputs(minilm):
  tokenizer = tokenization.FullTokenizer(minilm.vocab_file, True)
  ids, mask = _encode(tokenizer, SENTENCES[:3], 20)
  outputs = {}
  for compute_type in (tf.float32, tf.float16):
    with tf.Graph().as_default():
      model = modeling.BertModel(
          modeling.BertConfig.from_json_file(minilm.bert_config_file), False,
          tf.constant(ids), tf.constant(mask), compute_type=compute_type)
      tf.compat.v1.train.init_from_checkpoint(minilm.init_checkpoint,
                                              {"bert/": "bert/"})
      assert {v.dtype.base_dtype for v in
              tf.compat.v1.global_variables()} == {tf.float32}
      assert model.get_pooled_output().dtype == tf.float32
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        outputs[compute_type] = session.run(model.get_pooled_output())
  np.testing.assert_allclose(outputs[tf.float16], outputs[tf.float32],
                             atol=2e-2)
  assert np.abs(outputs[tf.float32]).max() > 0.1


def test_google_compatible_helpers(minilm):
  tokenizer = tokenization.FullTokenizer(minilm.vocab_file, True)
  ids, mask = _encode(tokenizer, SENTENCES[:2], 12)
  outputs = []
  for one_hot in (False, True):
    with tf.Graph().as_default():
      model = modeling.BertModel(
          modeling.BertConfig.from_json_file(minilm.bert_config_file), False,
          tf.constant(ids), tf.constant(mask), None, one_hot)
      assignment, initialized = modeling.get_assignment_map_from_checkpoint(
          tf.compat.v1.trainable_variables(), minilm.init_checkpoint)
      assert len(assignment) == len(tf.compat.v1.trainable_variables()) == 103
      assert "bert/pooler/dense/kernel:0" in initialized
      tf.compat.v1.train.init_from_checkpoint(minilm.init_checkpoint,
                                              assignment)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        outputs.append(session.run(model.get_sequence_output()))
  np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5)
  assert tokenization.convert_to_unicode(b"caf\xc3\xa9") == "café"
  tokenization.validate_case_matches_checkpoint(True, minilm.init_checkpoint)
  with pytest.raises(ValueError, match="uncased"):
    tokenization.validate_case_matches_checkpoint(False,
                                                  minilm.init_checkpoint)


def test_google_tokenizer_stages_compose_to_the_reference(minilm):
  """BasicTokenizer then WordpieceTokenizer, as Google's FullTokenizer runs
  them, give the real model's own tokenizer.json tokens."""
  tokenizer = tokenization.FullTokenizer(minilm.vocab_file, True)
  reference = Tokenizer.from_file(
      os.path.join(pretrained.minilm_hf_dir(), "tokenizer.json"))
  reference.no_padding()
  reference.no_truncation()
  basic = tokenization.BasicTokenizer(do_lower_case=True)
  wordpiece = tokenization.WordpieceTokenizer(tokenizer.vocab)
  for text in SENTENCES:
    words = basic.tokenize(text)
    pieces = wordpiece.tokenize(" ".join(words))
    assert pieces == reference.encode(text).tokens[1:-1], text
    assert tokenizer.wordpiece_tokenizer.tokenize(" ".join(
        tokenizer.basic_tokenizer.tokenize(text))) == pieces
  assert basic.tokenize(" Héllo, WORLD!\t") == ["hello", ",", "world", "!"]
  assert tokenization.BasicTokenizer(False).tokenize("Héllo!") == ["Héllo", "!"]
  assert tokenization.convert_tokens_to_ids(tokenizer.vocab,
                                            ["hello", "world"]) == [7592, 2088]
  assert tokenization.convert_ids_to_tokens(tokenizer.inv_vocab,
                                            [7592, 2088]) == ["hello", "world"]


def test_wordpiece_is_greedy_longest_match_first():
  # The example in Google's WordpieceTokenizer docstring.
  vocab = {"[UNK]": 0, "un": 1, "##aff": 2, "##able": 3, "a": 4, "##a": 5}
  wordpiece = tokenization.WordpieceTokenizer(vocab, max_input_chars_per_word=6)
  assert wordpiece.tokenize("unaffable") == ["[UNK]"]  # 9 characters > 6
  wordpiece = tokenization.WordpieceTokenizer(vocab)
  assert wordpiece.tokenize("unaffable  a\taa xyz") == [
      "un", "##aff", "##able", "a", "a", "##a", "[UNK]"]
  assert tokenization.whitespace_tokenize("  a b\tc\n") == ["a", "b", "c"]
  assert tokenization.whitespace_tokenize(b"  ") == []
