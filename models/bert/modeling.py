"""The BERT encoder in google-research/bert's public shape and variable names.

```python
config = modeling.BertConfig.from_json_file("bert_config.json")
model = modeling.BertModel(config, is_training=True, input_ids=input_ids,
                           input_mask=input_mask, token_type_ids=segment_ids)
pooled = model.get_pooled_output()      # float32 [batch_size, hidden_size]
sequence = model.get_sequence_output()  # float32 [batch_size, seq_length, hidden]
```

Variables are named as in Google's checkpoints (`bert/embeddings/
word_embeddings`, `bert/encoder/layer_0/attention/self/query/kernel`, ...), so
those checkpoints and the ones `models.bert.convert_hf` writes load with
`tf.compat.v1.train.init_from_checkpoint`.

Google's helpers that its other scripts (run_squad.py, run_pretraining.py,
extract_features.py) call keep their signatures: `get_shape_list`,
`assert_rank`, `create_initializer`, `get_activation`, `layer_norm`,
`dropout`, `layer_norm_and_dropout`, `create_attention_mask_from_input_mask`,
`get_assignment_map_from_checkpoint`.

`hidden_act="gelu"` is the exact (erf) GELU, as in Hugging Face's BERT;
"gelu_tanh" is the tanh approximation of Google's original code.
"""

import copy
import functools
import json
import math

import tensorflow as tf

import estimator_accum
from estimator_accum import native
from estimator_accum.window import keyed_dropout
from models.bert import packing


def _gelu_ops(x):
  """The exact (erf) GELU in TensorFlow's own ops."""
  return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def gelu_exact(x):
  """The exact (erf) GELU: in one pass forward and one backward
  (`estimator_accum.native`, float32 on the CPU, built once) where it
  serves, else TensorFlow's ops. The same values bit for bit on
  TensorFlow's own wheels (the kernel rounds as its Eigen build does)."""
  if x.dtype == tf.float32:
    kernel = native.gelu_op()
    if kernel is not None:
      return kernel(x)
  return _gelu_ops(x)


_ACTIVATIONS = {
    "gelu": gelu_exact,
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + tf.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3)))),
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
}


class BertConfig:
  """Hyperparameters of a BertModel (the keys of bert_config.json)."""

  def __init__(self, vocab_size, hidden_size=768, num_hidden_layers=12,
               num_attention_heads=12, intermediate_size=3072,
               hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, max_position_embeddings=512,
               type_vocab_size=16, initializer_range=0.02,
               layer_norm_eps=1e-12):
    # Like Google's, it checks nothing: BertModel checks what it builds.
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.hidden_act = hidden_act
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range
    self.layer_norm_eps = layer_norm_eps

  @classmethod
  def from_dict(cls, json_object):
    """Builds a config from a dict, every key kept as an attribute, as
    Google's does (Hugging Face configs carry many keys BertModel does not
    read)."""
    config = cls(vocab_size=None)
    for key, value in json_object.items():
      config.__dict__[key] = value
    return config



  @classmethod
  def from_json_file(cls, json_file):
    """Builds a config from a bert_config.json file."""
    with tf.io.gfile.GFile(json_file, "r") as reader:
      return cls.from_dict(json.loads(reader.read()))

  def to_dict(self):
    return copy.deepcopy(self.__dict__)

  def to_json_string(self):
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def check_config(config):
  """ValueError naming the value when a BertModel cannot be built from
  `config` (Google's checks, made where it builds attention and picks the
  activation)."""
  if config.hidden_size % config.num_attention_heads:
    raise ValueError(
        f"The hidden size ({config.hidden_size}) is not a multiple of the "
        f"number of attention heads ({config.num_attention_heads}).")
  if config.hidden_act not in _ACTIVATIONS:
    raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)}, "
                     f"got {config.hidden_act!r}.")


class BertModel:
  """The BERT encoder: embeddings, transformer layers and the pooler."""

  def __init__(self, config, is_training, input_ids, input_mask=None,
               token_type_ids=None, use_one_hot_embeddings=False, scope=None,
               compute_type=tf.float32, recompute=False, example_ids=None,
               max_examples=None, unpadded=False, pooled_only=False,
               dropout_keys=None, dropout_seed=0, fused_attention=True,
               product_type=None, window_copies=False):
    """Builds the encoder in the current graph.

    Args:
      config: BertConfig.
      is_training: bool; dropout is applied only when True.
      input_ids: int32 Tensor of shape [batch_size, seq_length].
      input_mask: optional int32 Tensor [batch_size, seq_length], 1 for real
        tokens and 0 for padding; default all ones.
      token_type_ids: optional int32 Tensor [batch_size, seq_length]; default
        all zeros.
      use_one_hot_embeddings: look word pieces up by a one-hot matrix
        product (TPU style; dense gradient) instead of a gather (sparse).
      scope: variable scope, default "bert".
      compute_type: tf.float32, or tf.float16 / tf.bfloat16 for mixed
        precision: variables stay float32 (so checkpoints are unchanged) and
        are cast for the matrix products; layer normalization and softmax
        run in float32; the outputs are float32.
      recompute: recompute each transformer layer's activations in the
        backward pass (`estimator_accum.recompute`, dropout replayed
        exactly): only each layer's input is kept for the backward pass.
        Same variables, same gradient; less memory, more time.
      example_ids: optional int32 Tensor [batch_size, seq_length] for packed
        rows (several examples in one row, `models.bert.packing`): each
        token's example in its row, 1, 2, ..., 0 for padding. Each token
        attends to its own example only, positions restart with each
        example, and `get_pooled_output` reads each example's first token:
        the model of one example per row, on fewer rows. `input_mask` is
        then ignored (0 in `example_ids` is padding); token types restart
        with each example in `token_type_ids`.
      max_examples: with `example_ids`, the most examples a row holds.
      unpadded: the layers' dense parts (the attention's projections, the
        feed-forward block, layer norms and dropout) compute the real
        tokens only (`input_mask`, or `example_ids` > 0), gathered into one
        [tokens, hidden] matrix: no work on padding. Attention itself runs
        on the padded [batch, heads, seq_length, seq_length] layout. Every
        real token's output is the padded model's (dropout off or keyed,
        `dropout_keys`: tf.nn.dropout's masks have other shapes); the
        outputs keep their shapes,
        with zeros at padding. Same variables, same checkpoints.
      pooled_only: the last layer computes only the tokens the pooler reads
        (each example's first token, [CLS]): their queries attend to every
        token's keys and values, and the layer's attention output,
        feed-forward block and layer norms run on those rows alone (on
        MiniLM, ~13% of the matrix products' FLOPs less).
        `get_pooled_output` is the full model's (dropout off or keyed:
        tf.nn.dropout's masks have other shapes); `get_sequence_output` and
        `get_all_encoder_layers` are not built and raise. Same variables,
        same checkpoints. For a classifier on the pooled output
        (run_classifier.py's default).
      dropout_keys: optional integer Tensor [batch_size], a key naming each
        example (`input_fn_builder(..., example_keys=True)`'s
        `example_key`): dropout's masks are then a hash of (dropout_seed,
        the site, the example's key, the token's position, the column),
        the same for an example whichever micro-batch it sits in
        (`estimator_accum.keyed_dropout`): every split of a window trains to the same
        weights. None: `tf.nn.dropout`. Not with packed rows.
      dropout_seed: int salting the keyed masks (with `dropout_keys`).
      fused_attention: with `unpadded`, in a training graph, attention
        runs as one native op over the real tokens (`estimator_accum.
        native`, attention.cc: scores, softmax, keyed dropout and context
        per example and head, no padding, no transposes, no scatter and
        gather) where it serves: float32, one example a row, dropout off
        or keyed, the kernels built; the same function up to float32
        rounding (the same dropout masks). False: TensorFlow's ops. Graphs
        to evaluate, predict or export always hold TensorFlow's ops.
      product_type: None, or tf.bfloat16: the layers' and the pooler's
        dense products take bfloat16 operands (the variables and
        activations cast in, the product cast back to the activations'
        float32 before the bias), everything else in float32: layer norms,
        softmax, attention, dropout, the loss. Gradients reach the
        variables in float32. Where the CPU (AVX512-BF16, AMX) or GPU
        multiplies bfloat16 natively.
      window_copies: with `product_type`, in a training graph whose loss
        goes to `estimator_accum.build_accumulating_train_op`: the
        kernels' `product_type` operands read from copies the train op
        remakes after each update (`estimator_accum.cast_once_per_window`),
        not cast from the float32 kernels each micro-batch: the same
        values and gradients, one cast of the weights a window, not k.

    Raises:
      ValueError: if input_ids is not of rank 2, or is longer than
        config.max_position_embeddings.
    """
    check_config(config)
    config = copy.deepcopy(config)
    if not is_training:
      config.hidden_dropout_prob = 0.0
      config.attention_probs_dropout_prob = 0.0
    if input_ids.shape.rank != 2:
      raise ValueError(f"input_ids must have rank 2 [batch_size, seq_length], "
                       f"got shape {input_ids.shape}.")
    seq_length = input_ids.shape[1]
    if seq_length is not None and seq_length > config.max_position_embeddings:
      raise ValueError(
          f"input_ids has sequence length {seq_length}, above the model's "
          f"max_position_embeddings ({config.max_position_embeddings}).")
    if (example_ids is None) != (max_examples is None):
      raise ValueError("example_ids and max_examples go together (packed "
                       f"rows), got example_ids={example_ids!r}, "
                       f"max_examples={max_examples!r}")
    if not isinstance(unpadded, bool):
      raise ValueError(f"unpadded must be True or False, got {unpadded!r}")
    if not isinstance(pooled_only, bool):
      raise ValueError(
          f"pooled_only must be True or False, got {pooled_only!r}")
    if not isinstance(fused_attention, bool):
      raise ValueError(
          f"fused_attention must be True or False, got {fused_attention!r}")
    self._pooled_only = pooled_only
    self._fused_attention = fused_attention
    self._token_rows = None  # (starts, positions) for the fused attention.
    self._is_training = bool(is_training)
    self._keys = None  # [batch, length] words: each token's dropout key.
    if dropout_keys is not None:
      if example_ids is not None:
        raise ValueError("dropout_keys with packed rows (example_ids): keyed "
                         "dropout is for one example a row")
      self._seed = dropout_seed
      self.example_dropout_keys = keyed_dropout.example_keys(dropout_keys,
                                                             dropout_seed)
      self._keys = keyed_dropout.token_keys(self.example_dropout_keys,
                                            tf.shape(input_ids)[1],
                                            dropout_seed)
    if input_mask is None and example_ids is None:
      input_mask = tf.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = tf.zeros_like(input_ids)
    self._config = config
    self._compute_type = tf.as_dtype(compute_type)
    # A layer norm read by one bfloat16 product gives it its twin.
    self._narrow_twins = bool(
        is_training and product_type is not None and
        tf.as_dtype(product_type) == tf.bfloat16 and
        self._compute_type == tf.float32)
    self._dense = functools.partial(
        _dense, products=None if product_type is None else
        tf.as_dtype(product_type), copies=bool(window_copies and is_training),
        kernels=self._is_training)
    self._one_hot = use_one_hot_embeddings

    with tf.compat.v1.variable_scope(scope, default_name="bert"):
      with tf.compat.v1.variable_scope("embeddings"):
        self.embedding_output = self._embeddings(
            input_ids, token_type_ids, None if example_ids is None else
            packing.position_ids(example_ids))
      with tf.compat.v1.variable_scope("encoder"):
        if example_ids is None:
          bias = (1.0 - tf.cast(input_mask[:, tf.newaxis, tf.newaxis, :],
                                tf.float32)) * -10000.0
        else:
          bias = packing.attention_bias(example_ids)
        self.all_encoder_layers = []
        layer_input = tf.cast(self.embedding_output, self._compute_type)
        layer = estimator_accum.recompute(self._layer) if recompute else (
            self._layer)
        real = ()
        if unpadded:
          token_real = (input_mask > 0 if example_ids is None else
                        example_ids > 0)
          # [tokens, 1]: where each real token sits in the flattened rows.
          real = (tf.where(tf.reshape(token_real, [-1])),)
          if example_ids is None:
            # Each example's first row among the real tokens, and each
            # token's position in its row.
            self._token_rows = (
                tf.concat([[0], tf.cumsum(tf.reduce_sum(
                    tf.cast(token_real, tf.int32), axis=1))], 0),
                tf.cast(real[0][:, 0] % tf.cast(tf.shape(input_ids)[1],
                                                tf.int64), tf.int32))
          batch_and_length = tf.unstack(tf.shape(input_ids))
          layer_input = tf.gather_nd(
              tf.reshape(layer_input, [-1, config.hidden_size]), real[0])
        self.example_mask = None
        if example_ids is None:
          starts = (tf.zeros([tf.shape(input_ids)[0], 1], tf.int32)
                    if pooled_only else None)
        else:
          starts, self.example_mask = packing.first_tokens(example_ids,
                                                           max_examples)
        last = config.num_hidden_layers - 1
        for index in range(config.num_hidden_layers):
          with tf.compat.v1.variable_scope(f"layer_{index}"):
            if index == last and pooled_only:
              # [batch, 1 or max_examples, hidden]: each example's first
              # token, the rows the pooler reads.
              first = layer(layer_input, bias, *real, starts=starts)
              if real:
                # A row without a real token at a start (all padding) is
                # zeros there, as the full unpadded layer's output.
                present = tf.gather(token_real, starts, batch_dims=1)
                first = tf.where(present[..., tf.newaxis], first,
                                 tf.zeros_like(first))
              break
            layer_input = layer(layer_input, bias, *real)
          padded = (_padded(layer_input, *real, *batch_and_length) if real
                    else layer_input)
          self.all_encoder_layers.append(tf.cast(padded, tf.float32))
        else:
          # The last layer in rows again (one scatter, shared with its
          # output above), for the pooler.
          first = (padded[:, 0] if example_ids is None else
                   tf.gather(padded, starts, batch_dims=1))
      self.sequence_output = (None if pooled_only else
                              self.all_encoder_layers[-1])
      if pooled_only and example_ids is None:
        first = first[:, 0]
      with tf.compat.v1.variable_scope("pooler"):
        self.pooled_output = tf.cast(self._dense(
            first, config.hidden_size, "dense",
            config.initializer_range, activation=tf.tanh), tf.float32)

  def _embeddings(self, input_ids, token_type_ids, position_ids=None):
    config = self._config
    init = _initializer(config.initializer_range)
    self.embedding_table = tf.compat.v1.get_variable(
        "word_embeddings", [config.vocab_size, config.hidden_size],
        initializer=init)
    token_types = tf.compat.v1.get_variable(
        "token_type_embeddings", [config.type_vocab_size, config.hidden_size],
        initializer=init)
    positions = tf.compat.v1.get_variable(
        "position_embeddings",
        [config.max_position_embeddings, config.hidden_size], initializer=init)
    seq_length = tf.shape(input_ids)[1]
    if self._one_hot:
      words = tf.einsum("bsv,vh->bsh",
                        tf.one_hot(input_ids, config.vocab_size),
                        self.embedding_table)
    else:
      words = tf.gather(self.embedding_table, input_ids)
    output = (words +
              tf.gather(token_types, token_type_ids) +
              (positions[tf.newaxis, :seq_length] if position_ids is None else
               tf.gather(positions, position_ids)))
    output = _layer_norm(output, config.layer_norm_eps,
                         one_pass=self._is_training)
    return self._dropout(output, config.hidden_dropout_prob, self._keys)

  def _dropout(self, inputs, rate, row_keys, site=""):
    """Keyed dropout (`dropout_keys`; `row_keys`, words of
    `inputs.shape[:-1]`, salted by `site` and the variable scope) or
    tf.nn.dropout."""
    if self._keys is None or not rate:
      return _dropout(inputs, rate)
    return keyed_dropout.keyed_dropout(inputs, rate, row_keys,
                                       seed=self._seed, site=self._site(site))

  def _site(self, site):
    """Keyed dropout's site: `site` in the variable scope."""
    return f"{tf.compat.v1.get_variable_scope().name}/{site}"

  def _dropout_words(self, rate, row_keys, width, site=""):
    """(rows, columns, threshold, scale): `_dropout`'s masks at `site` for
    `width` columns, for a native op that drops inside."""
    rows, columns, threshold = keyed_dropout.words(
        rate, row_keys, width, seed=self._seed, site=self._site(site))
    return rows, columns, threshold, 1.0 / (1.0 - rate)

  def _fused_op(self):
    """The native attention op (`native.attention_op`) where this model's
    training graph may hold it (`fused_attention`), else None."""
    return fused_attention_op(
        self._config, fused_attention=self._fused_attention,
        is_training=self._is_training,
        one_example_a_row=self._token_rows is not None,
        compute_type=self._compute_type, keyed=self._keys is not None)

  def _fused_attention_layer(self, attention, query, layer_input, query_grid,
                             length, heads, head_size):
    """The attention's context [tokens, hidden] of the unpadded `query`
    and of the keys and values of `layer_input` by the native op: the
    padded layout's function (a padded key's probability there is 0), the
    same keyed dropout masks (the same site)."""
    config = self._config
    key, value = (self._dense(layer_input, config.hidden_size, name,
                         config.initializer_range)
                  for name in ("key", "value"))
    rate = config.attention_probs_dropout_prob
    if rate:
      rows, columns, threshold, scale = self._dropout_words(
          rate, query_grid, length, "probs")
    else:
      rows = tf.zeros([0, 0, 0], tf.uint32)
      columns, threshold, scale = tf.zeros([0], tf.uint32), 0, 1.0
    return attention(query, key, value, *self._token_rows, rows, columns,
                     heads=heads, divisor=math.sqrt(head_size),
                     threshold=threshold, scale=scale)

  def _layer(self, layer_input, attention_bias, real=None, starts=None):
    """One transformer layer; with `real` ([tokens, 1] int64, unpadded), of
    the real tokens' [tokens, hidden] matrix, each token's projections put
    back in its row for attention and the attention's output taken out.
    With `starts` (int32 [batch, n]), only the tokens at `starts` in each
    row are computed (their queries attend to every token): [batch, n,
    hidden]."""
    config = self._config
    heads = config.num_attention_heads
    head_size = config.hidden_size // heads
    batch, length = tf.shape(attention_bias)[0], tf.shape(attention_bias)[-1]

    def rows(x):
      return x if real is None else _padded(x, real, batch, length)

    def split_heads(x, count):
      x = tf.reshape(x, [batch, count, heads, head_size])
      return tf.transpose(x, [0, 2, 1, 3])

    # Dropout's row keys (keyed dropout): the rows the layer's output has
    # (`query_keys`), and the attention's queries, a head each.
    query_keys = query_grid = None
    if self._keys is not None:
      query_keys = query_grid = self._keys
      if starts is not None:
        query_keys = query_grid = tf.gather(self._keys, starts, batch_dims=1)
      elif real is not None:
        query_keys = tf.gather_nd(tf.reshape(self._keys, [-1]), real)
      query_grid = keyed_dropout.per_head(query_grid, heads, self._seed)

    with tf.compat.v1.variable_scope("attention"):
      with tf.compat.v1.variable_scope("self"):
        query_input, count = layer_input, length
        if starts is not None:
          query_input = tf.gather(rows(layer_input), starts, batch_dims=1)
          count = tf.shape(starts)[1]
          if attention_bias.shape[2] != 1:  # Packed: a row per query.
            attention_bias = tf.gather(attention_bias[:, 0], starts,
                                       batch_dims=1)[:, tf.newaxis]
        query = self._dense(query_input, config.hidden_size, "query",
                       config.initializer_range)
        fused = (self._fused_op() if real is not None and starts is None
                 else None)
        if fused is not None:
          context = self._fused_attention_layer(
              fused, query, layer_input, query_grid, length, heads,
              head_size)
        if fused is None:
          query = split_heads(rows(query) if starts is None else query, count)
          key, value = (
              split_heads(rows(self._dense(layer_input, config.hidden_size, name,
                                      config.initializer_range)), length)
              for name in ("key", "value"))
          scores = tf.matmul(query, key, transpose_b=True) / math.sqrt(
              head_size)
          probs = tf.nn.softmax(tf.cast(scores, tf.float32) + attention_bias)
          probs = self._dropout(tf.cast(probs, layer_input.dtype),
                                config.attention_probs_dropout_prob,
                                query_grid, "probs")
          context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
          context = tf.reshape(context, [batch, count, config.hidden_size])
          if real is not None and starts is None:
            context = tf.gather_nd(
                tf.reshape(context, [-1, config.hidden_size]), real)
      with tf.compat.v1.variable_scope("output"):
        # Its bfloat16 twin (the next product's operand) from the same
        # pass where the products are bfloat16.
        attention = self._add_and_norm(context, query_input, query_keys,
                                       narrow=self._narrow_twins)
        narrow = None
        if self._narrow_twins:
          attention, narrow = attention
    with tf.compat.v1.variable_scope("intermediate"):
      activation = _ACTIVATIONS[config.hidden_act]
      if activation is gelu_exact and not self._is_training:
        # A graph to evaluate, predict or export: TensorFlow's ops, which
        # any process (a server) runs, the kernel's values (as the layer
        # norms': one_pass in training graphs only).
        activation = _gelu_ops
      intermediate = self._dense(
          attention, config.intermediate_size, "dense",
          config.initializer_range, activation=activation,
          narrow_inputs=narrow)
    with tf.compat.v1.variable_scope("output"):
      return self._add_and_norm(intermediate, attention, query_keys,
                                dtype=attention.dtype)

  def _add_and_norm(self, inputs, residual, row_keys, narrow=False,
                    **dense):
    """The layer norm (`LayerNorm`) of the dropout (`row_keys`) of the
    dense product of `inputs` (`dense`, more of `_dense`'s arguments) plus
    `residual`; with `narrow`, `_layer_norm`'s pair. In a training graph
    with keyed dropout, all after the product is one native op each way
    (`native.residual_layer_norm_op`: the bias, the dropout reading a
    bfloat16 product, the add and the layer norm; the values of the ops
    it replaces bit for bit)."""
    config = self._config
    rate = config.hidden_dropout_prob
    fused = (native.residual_layer_norm_op()
             if self._is_training and self._keys is not None and rate and
             self._compute_type == tf.float32 and
             keyed_dropout.word_dtype() == tf.uint32 else None)
    if fused is None:
      output = self._dense(inputs, config.hidden_size, "dense",
                           config.initializer_range, **dense)
      return _layer_norm(self._dropout(output, rate, row_keys) + residual,
                         config.layer_norm_eps, one_pass=self._is_training,
                         narrow=narrow)
    product, bias = self._dense(inputs, config.hidden_size, "dense",
                                config.initializer_range, split_bias=True,
                                **dense)
    gamma, beta = _layer_norm_variables(config.hidden_size)
    return fused(product, bias, residual, gamma, beta, config.layer_norm_eps,
                 self._dropout_words(rate, row_keys, tf.shape(product)[-1]),
                 narrow=narrow)

  def get_pooled_output(self):
    """float32 Tensor [batch_size, hidden_size]: tanh(dense([CLS] output));
    with packed rows [batch_size, max_examples, hidden_size], one per
    example (`get_example_mask` says which a row holds)."""
    return self.pooled_output

  def get_example_mask(self):
    """With packed rows, bool Tensor [batch_size, max_examples]: whether a
    row holds its n-th example; None without."""
    return self.example_mask

  def get_sequence_output(self):
    """float32 Tensor [batch_size, seq_length, hidden_size]: the last layer."""
    self._check_full("get_sequence_output")
    return self.sequence_output

  def get_all_encoder_layers(self):
    """List of float32 Tensors [batch_size, seq_length, hidden_size]."""
    self._check_full("get_all_encoder_layers")
    return self.all_encoder_layers

  def _check_full(self, method):
    if self._pooled_only:
      raise ValueError(
          f"BertModel.{method}: this model was built with pooled_only=True, "
          "whose last layer computes each example's first token only; "
          "build it with pooled_only=False for every token's output.")

  def get_embedding_output(self):
    """float32 Tensor [batch_size, seq_length, hidden_size]."""
    return self.embedding_output

  def get_embedding_table(self):
    """float32 Variable [vocab_size, hidden_size]."""
    return self.embedding_table


def fused_attention_op(config, *, fused_attention, is_training,
                       one_example_a_row, compute_type, keyed):
  """The native attention op (`native.attention_op`) where a BertModel's
  layers hold it, else None: asked for (`fused_attention`), a training
  graph, the real tokens unpadded one example a row (`one_example_a_row`:
  unpadded, not packed), float32, attention's dropout off or keyed by
  example (`keyed`), and the native kernels built here. BertModel and
  run_classifier's line on the layers both ask this."""
  if (not fused_attention or not is_training or not one_example_a_row or
      compute_type != tf.float32 or
      (config.attention_probs_dropout_prob and not keyed)):
    return None
  return native.attention_op()


def _padded(tokens, real, batch, length):
  """The real tokens' [tokens, width] rows put back in [batch, length,
  width], zeros at padding."""
  rows = tf.scatter_nd(real, tokens, [batch * length, tf.shape(tokens)[-1]])
  return tf.reshape(rows, [batch, length, tokens.shape[-1]])


def get_assignment_map_from_checkpoint(tvars, init_checkpoint):
  """google-research/bert's helper: maps the variables in `tvars` that the
  checkpoint has (same name and shape) to themselves.

  Returns:
    (assignment_map, initialized_variable_names), the second with both
    `name` and `name:0` keys, as Google's.
  """
  shapes = tf.train.load_checkpoint(init_checkpoint).get_variable_to_shape_map()
  assignment_map, initialized = {}, {}
  for var in tvars:
    name = var.name.split(":")[0]
    if name in shapes and list(shapes[name]) == var.shape.as_list():
      assignment_map[name] = name
      initialized[name] = 1
      initialized[name + ":0"] = 1
  return assignment_map, initialized


def get_shape_list(tensor, expected_rank=None, name=None):
  """google-research/bert's helper: the shape of `tensor` as a list, each
  dimension a Python int where it is known and a scalar int32 Tensor where it
  is not.

  Args:
    tensor: a tf.Tensor.
    expected_rank: optional int or list of ints; the rank must be one of them.
    name: optional name of the tensor for the error message.

  Raises:
    ValueError: if the rank is not `expected_rank`.
  """
  if expected_rank is not None:
    assert_rank(tensor, expected_rank, name)
  shape = tensor.shape.as_list()
  if all(dim is not None for dim in shape):
    return shape
  dynamic = tf.shape(tensor)
  return [dim if dim is not None else dynamic[index]
          for index, dim in enumerate(shape)]


def assert_rank(tensor, expected_rank, name=None):
  """Raises ValueError naming the tensor when its rank is not `expected_rank`
  (an int or a list of ints)."""
  expected = ([expected_rank] if isinstance(expected_rank, int)
              else list(expected_rank))
  if tensor.shape.rank not in expected:
    raise ValueError(
        f"tensor {name or tensor.name} has rank {tensor.shape.rank} (shape "
        f"{tensor.shape}), expected rank {' or '.join(map(str, expected))}.")


def create_initializer(initializer_range=0.02):
  """The truncated normal initializer of every BERT weight."""
  return tf.compat.v1.truncated_normal_initializer(stddev=initializer_range)


def get_activation(activation_string):
  """Maps a `hidden_act` name to its function, as google-research/bert's.

  Returns the argument itself when it is not a string, and None for None,
  "" and "linear". "gelu" is the exact (erf) GELU, "gelu_tanh" Google's tanh
  approximation; also "relu" and "tanh".

  Raises:
    ValueError: for another name.
  """
  if not isinstance(activation_string, str):
    return activation_string
  name = activation_string.lower()
  if name in ("", "linear"):
    return None
  if name not in _ACTIVATIONS:
    raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)} or "
                     f"linear, got {activation_string!r}.")
  return _ACTIVATIONS[name]


def gelu(x):
  """Google's GELU (its tanh approximation), as google-research/bert's
  `modeling.gelu`; `hidden_act="gelu"` uses the exact erf form."""
  return _ACTIVATIONS["gelu_tanh"](x)


def reshape_to_matrix(input_tensor):
  """A tensor of rank >= 2 as a matrix [-1, width] (Google's helper)."""
  rank = input_tensor.shape.rank
  if rank is not None and rank < 2:
    raise ValueError(f"input tensor must have rank >= 2, got shape "
                     f"{input_tensor.shape}.")
  if rank == 2:
    return input_tensor
  return tf.reshape(input_tensor, [-1, input_tensor.shape[-1]])


def reshape_from_matrix(output_tensor, orig_shape_list):
  """A matrix back to `orig_shape_list`'s leading dimensions and its own
  width (Google's helper)."""
  if len(orig_shape_list) == 2:
    return output_tensor
  width = get_shape_list(output_tensor)[-1]
  return tf.reshape(output_tensor, orig_shape_list[:-1] + [width])


def layer_norm(input_tensor, name=None, epsilon=1e-12):
  """Layer normalization over the last axis, with variables
  `<name or LayerNorm>/beta` and `/gamma` as in Google's checkpoints."""
  return _layer_norm(input_tensor, epsilon, name or "LayerNorm")


def dropout(input_tensor, dropout_prob):
  """Dropout with drop probability `dropout_prob` (None or 0: none)."""
  return _dropout(input_tensor, dropout_prob)


def layer_norm_and_dropout(input_tensor, dropout_prob, name=None):
  """`layer_norm` then `dropout`, as Google's embedding post-processing."""
  return dropout(layer_norm(input_tensor, name), dropout_prob)


def embedding_lookup(input_ids, vocab_size, embedding_size=128,
                     initializer_range=0.02,
                     word_embedding_name="word_embeddings",
                     use_one_hot_embeddings=False):
  """Google's embedding_lookup: (float32 Tensor [batch_size, seq_length,
  embedding_size], the embedding table) for int32 `input_ids` of shape
  [batch_size, seq_length] (or [batch_size, seq_length, 1])."""
  if input_ids.shape.rank == 2:
    input_ids = tf.expand_dims(input_ids, axis=-1)
  table = tf.compat.v1.get_variable(
      word_embedding_name, [vocab_size, embedding_size],
      initializer=create_initializer(initializer_range))
  flat_ids = tf.reshape(input_ids, [-1])
  if use_one_hot_embeddings:
    output = tf.matmul(tf.one_hot(flat_ids, depth=vocab_size), table)
  else:
    output = tf.gather(table, flat_ids)
  shape = get_shape_list(input_ids)
  return (tf.reshape(output, shape[0:-1] + [shape[-1] * embedding_size]),
          table)


def embedding_postprocessor(input_tensor, use_token_type=False,
                            token_type_ids=None, token_type_vocab_size=16,
                            token_type_embedding_name="token_type_embeddings",
                            use_position_embeddings=True,
                            position_embedding_name="position_embeddings",
                            initializer_range=0.02,
                            max_position_embeddings=512, dropout_prob=0.1):
  """Google's embedding_postprocessor: adds token type and position
  embeddings to `input_tensor` (float32 [batch_size, seq_length, width]),
  then layer normalization (`LayerNorm`) and dropout."""
  batch_size, seq_length, width = get_shape_list(input_tensor,
                                                 expected_rank=3)
  output = input_tensor
  if use_token_type:
    if token_type_ids is None:
      raise ValueError("`token_type_ids` must be specified if "
                       "`use_token_type` is True.")
    token_types = tf.compat.v1.get_variable(
        token_type_embedding_name, [token_type_vocab_size, width],
        initializer=create_initializer(initializer_range))
    output += tf.gather(token_types, token_type_ids)
  if use_position_embeddings:
    positions = tf.compat.v1.get_variable(
        position_embedding_name, [max_position_embeddings, width],
        initializer=create_initializer(initializer_range))
    output += positions[tf.newaxis, :seq_length]
  return layer_norm_and_dropout(output, dropout_prob)


def attention_layer(from_tensor, to_tensor, attention_mask=None,
                    num_attention_heads=1, size_per_head=512,
                    query_act=None, key_act=None, value_act=None,
                    attention_probs_dropout_prob=0.0, initializer_range=0.02,
                    do_return_2d_tensor=False, batch_size=None,
                    from_seq_length=None, to_seq_length=None):
  """Google's attention_layer: multi-headed attention from `from_tensor`
  ([batch_size, from_seq_length, width], or 2-D with the lengths given) to
  `to_tensor`, with variables `query`, `key`, `value` in the current scope.
  `attention_mask`: [batch_size, from_seq_length, to_seq_length], 1 where
  attention is allowed. Returns [batch_size, from_seq_length,
  num_attention_heads * size_per_head] (2-D [batch_size * from_seq_length,
  ...] with do_return_2d_tensor)."""
  from_shape = get_shape_list(from_tensor, expected_rank=[2, 3])
  to_shape = get_shape_list(to_tensor, expected_rank=[2, 3])
  if len(from_shape) != len(to_shape):
    raise ValueError("The rank of `from_tensor` must match the rank of "
                     "`to_tensor`.")
  if len(from_shape) == 3:
    batch_size, from_seq_length, to_seq_length = (
        from_shape[0], from_shape[1], to_shape[1])
  elif batch_size is None or from_seq_length is None or to_seq_length is None:
    raise ValueError("When passing in rank 2 tensors to attention_layer, the "
                     "values for `batch_size`, `from_seq_length`, and "
                     "`to_seq_length` must all be specified.")
  width = num_attention_heads * size_per_head

  def heads(x, length, name, activation):
    x = _dense(reshape_to_matrix(x), width, name, initializer_range,
               activation=get_activation(activation))
    x = tf.reshape(x, [batch_size, length, num_attention_heads,
                       size_per_head])
    return tf.transpose(x, [0, 2, 1, 3])

  query = heads(from_tensor, from_seq_length, "query", query_act)
  key = heads(to_tensor, to_seq_length, "key", key_act)
  value = heads(to_tensor, to_seq_length, "value", value_act)
  scores = tf.matmul(query, key, transpose_b=True) / math.sqrt(size_per_head)
  if attention_mask is not None:
    mask = tf.cast(attention_mask[:, tf.newaxis], scores.dtype)
    scores += (1.0 - mask) * -10000.0
  probs = dropout(tf.nn.softmax(scores), attention_probs_dropout_prob)
  context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
  if do_return_2d_tensor:
    return tf.reshape(context, [batch_size * from_seq_length, width])
  return tf.reshape(context, [batch_size, from_seq_length, width])


def transformer_model(input_tensor, attention_mask=None, hidden_size=768,
                      num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, intermediate_act_fn=gelu,
                      hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1,
                      initializer_range=0.02, do_return_all_layers=False,
                      recompute=False):
  """Google's transformer_model: `num_hidden_layers` layers (`layer_<i>`,
  with Google's variable names) over float32 `input_tensor` [batch_size,
  seq_length, hidden_size]. Returns the last layer's output, or the list of
  every layer's with do_return_all_layers. With recompute, each layer's
  activations are recomputed in the backward pass (`BertModel`'s
  recompute)."""
  if hidden_size % num_attention_heads != 0:
    raise ValueError(
        f"The hidden size ({hidden_size}) is not a multiple of the number of "
        f"attention heads ({num_attention_heads})")
  batch_size, seq_length, width = get_shape_list(input_tensor,
                                                 expected_rank=3)
  if width != hidden_size:
    raise ValueError(f"The width of the input tensor ({width}) != hidden "
                     f"size ({hidden_size})")
  layer_input = reshape_to_matrix(input_tensor)

  # The mask is an argument, not a closure, when there is one.
  masks = [] if attention_mask is None else [attention_mask]

  def layer(layer_input, *mask):
    with tf.compat.v1.variable_scope("attention"):
      with tf.compat.v1.variable_scope("self"):
        context = attention_layer(
            layer_input, layer_input, mask[0] if mask else None,
            num_attention_heads,
            hidden_size // num_attention_heads,
            attention_probs_dropout_prob=attention_probs_dropout_prob,
            initializer_range=initializer_range, do_return_2d_tensor=True,
            batch_size=batch_size, from_seq_length=seq_length,
            to_seq_length=seq_length)
      with tf.compat.v1.variable_scope("output"):
        attention = layer_norm(dropout(
            _dense(context, hidden_size, "dense", initializer_range),
            hidden_dropout_prob) + layer_input)
    with tf.compat.v1.variable_scope("intermediate"):
      intermediate = _dense(attention, intermediate_size, "dense",
                            initializer_range,
                            activation=get_activation(intermediate_act_fn))
    with tf.compat.v1.variable_scope("output"):
      return layer_norm(dropout(
          _dense(intermediate, hidden_size, "dense", initializer_range),
          hidden_dropout_prob) + attention)

  if recompute:
    layer = estimator_accum.recompute(layer)
  outputs = []
  for index in range(num_hidden_layers):
    with tf.compat.v1.variable_scope(f"layer_{index}"):
      layer_input = layer(layer_input, *masks)
      outputs.append(reshape_from_matrix(layer_input,
                                         [batch_size, seq_length, width]))
  return outputs if do_return_all_layers else outputs[-1]


def create_attention_mask_from_input_mask(from_tensor, to_mask):
  """float32 Tensor [batch_size, from_seq_length, to_seq_length]: 1 where a
  position of `from_tensor` ([batch_size, from_seq_length, ...]) may attend
  to a position of `to_mask` (int32 [batch_size, to_seq_length], 1 for real
  tokens)."""
  from_shape = get_shape_list(from_tensor, expected_rank=[2, 3])
  to_mask = tf.cast(to_mask[:, tf.newaxis, :], tf.float32)
  return tf.ones([from_shape[0], from_shape[1], 1], tf.float32) * to_mask


def _initializer(stddev):
  return create_initializer(stddev)


def _dense(inputs, units, name, initializer_range, activation=None,
           products=None, copies=False, dtype=None, kernels=False,
           narrow_inputs=None, split_bias=False):
  """A dense layer with Google's variable names `<name>/kernel`, `/bias`;
  with `products` (a dtype), its product's operands in that dtype, the
  result back in `dtype` (default `inputs`' dtype; `copies`: the kernel's
  operand from its copy made once a window,
  `estimator_accum.cast_once_per_window`). `kernels` (a training graph):
  a bfloat16 product's widening and bias by the native kernel where it
  serves, and with `gelu_exact` the GELU too, given in bfloat16 for the
  next product (`native.bias_widen_op`, `bias_gelu_op`: the values of the
  ops they replace). `narrow_inputs`: `inputs` already in `products`' dtype
  (a layer norm's twin), read in place of their cast. `split_bias` (no
  `activation`): the pair (the product, its bias) for an op that adds the
  bias itself: a bfloat16 product before its widening (the bias float32),
  else the product with its bias added (BiasAdd) and None."""
  variable, bias = dense_variables(inputs, units, name, initializer_range)
  dtype = tf.as_dtype(dtype or inputs.dtype)
  kernel, bias = tf.cast(variable, dtype), tf.cast(bias, dtype)
  axes = [[inputs.shape.rank - 1], [0]]
  if products is not None and products != dtype:
    narrow = (estimator_accum.cast_once_per_window(variable, products)
              if copies and dtype == tf.float32
              else tf.cast(kernel, products))
    operand = (tf.cast(inputs, products) if narrow_inputs is None
               else narrow_inputs)
    product = tf.tensordot(operand, narrow, axes)
    kernels = kernels and products == tf.bfloat16 and dtype == tf.float32
    if split_bias and kernels:
      return product, bias
    gelu = (native.bias_gelu_op() if kernels and activation is gelu_exact
            else None)
    if gelu is not None:
      return gelu(product, bias)
    widen = native.bias_widen_op() if kernels else None
    output = (widen(product, bias) if widen is not None
              else tf.cast(product, dtype) + bias)
  else:
    # BiasAdd, not a broadcast add: Grappler fuses a product and its
    # BiasAdd into one kernel (oneDNN's matmul with its bias), and the
    # bias's gradient is one BiasAddGrad, not a broadcast's Sum and
    # reshapes (steady float32 training 1.10x, docs/bert.md).
    output = tf.nn.bias_add(tf.tensordot(inputs, kernel, axes), bias)
  if split_bias:
    return output, None
  return activation(output) if activation else output


def dense_variables(inputs, units, name, initializer_range):
  """A dense layer's `<name>/kernel` and `/bias` variables (made or
  reused)."""
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        "kernel", [inputs.shape[-1], units],
        initializer=_initializer(initializer_range))
    bias = tf.compat.v1.get_variable(
        "bias", [units], initializer=tf.compat.v1.zeros_initializer())
  return kernel, bias


def _layer_norm(inputs, epsilon, scope="LayerNorm", one_pass=False,
                narrow=False):
  """Layer normalization over the last axis, variables `<scope>/beta|gamma`.

  `one_pass` (a training graph): the native kernel where it serves, the
  normalization, gamma and beta in one op each way (`native.layer_norm_op`:
  the values of the ops it replaces bit for bit, gamma's and beta's
  gradients within float rounding). `narrow`: returns the pair (output,
  its bfloat16 copy made in the same pass, or None where the kernel does
  not serve or `inputs` are not float32), for a bfloat16 product to read
  in place of a cast."""
  gamma, beta = _layer_norm_variables(inputs.shape[-1], scope)
  dtype = inputs.dtype
  inputs = tf.cast(inputs, tf.float32)  # Statistics in float32.
  fused = native.layer_norm_op() if one_pass else None
  twin = None
  if fused is None:
    output = normalize_last_axis(inputs, epsilon, one_pass=one_pass) * gamma
    output += beta
  elif narrow and dtype == tf.float32:
    output, twin = fused(inputs, gamma, beta, epsilon, narrow=True)
  else:
    output = fused(inputs, gamma, beta, epsilon)
  output = tf.cast(output, dtype)
  return (output, twin) if narrow else output


def _layer_norm_variables(size, scope="LayerNorm"):
  """A layer norm's (gamma, beta), `<scope>/gamma|beta` (made or
  reused)."""
  with tf.compat.v1.variable_scope(scope):
    beta = tf.compat.v1.get_variable(
        "beta", [size], initializer=tf.compat.v1.zeros_initializer())
    gamma = tf.compat.v1.get_variable(
        "gamma", [size], initializer=tf.compat.v1.ones_initializer())
  return gamma, beta


def normalize_last_axis(inputs, epsilon, one_pass=False):
  """(x - mean) / sqrt(variance + epsilon) over the last axis.

  The variance is the mean square of the centred values, not
  `tf.nn.moments`'s `SquaredDifference`: with oneDNN on (TensorFlow 2.15's
  default on x86 Linux), Grappler's remapper takes `moments` followed by
  `* gamma + beta` for an instance norm and reads gamma as a constant; when
  gamma is a variable the protobuf lookup fails and the process dies
  (`CHECK failed: ... key not found: value`, then a segfault) as soon as the
  graph runs without a backward pass in a plain Session. See
  docs/troubleshooting.md. Centring once is also one subtraction fewer.

  Args:
    inputs: float32 Tensor of any rank >= 1.
    epsilon: float added to the variance.
    one_pass: True: `estimator_accum.native`'s kernel where it serves (a
      training graph: three passes over the tensor each way, where these
      ops take eight forward and about sixteen backward; the same values
      bit for bit, the gradient within float rounding), else TensorFlow's
      ops, which a graph to export needs.

  Returns:
    float32 Tensor of the shape of `inputs`.
  """
  if one_pass and inputs.dtype == tf.float32:
    kernel = native.normalize_op()
    if kernel is not None:
      return kernel(inputs, epsilon)
  mean = tf.reduce_mean(inputs, [-1], keepdims=True)
  centred = inputs - mean
  variance = tf.reduce_mean(tf.square(centred), [-1], keepdims=True)
  return centred * tf.math.rsqrt(variance + epsilon)


def _dropout(inputs, rate):
  if not rate:
    return inputs
  return tf.nn.dropout(inputs, rate=rate)
