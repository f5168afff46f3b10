"""Keras source models for the importer tests, built with Keras 3 (and keras_hub as installed).

* `TutorialTransformer`: the structure of the TensorFlow text tutorial "Neural machine translation
  with a Transformer and Keras" (tensorflow/text, docs/tutorials/transformer.ipynb), written for
  this suite from its public description: the same classes, attribute names (which name the
  variables in the weights file), layers and calls. One change: the tutorial casts its positional
  table and ``sqrt(d_model)`` to float32; here they take the layer's compute dtype, so that the
  model can run in float64 (in float32 it is the tutorial's computation).
* `keras_hub_model`: the keras.io example "English-to-Spanish translation with KerasHub":
  ``TokenAndPositionEmbedding`` + ``TransformerEncoder`` for the encoder, a decoder built as a
  ``keras.Model`` of its own (``TokenAndPositionEmbedding``, ``TransformerDecoder``, ``Dropout(0.5)``,
  ``Dense(vocab, softmax)``), or (``nested=False``) all in one functional model.

`float_policy` builds a model in float64 (Keras' global dtype policy and floatx, which every layer,
dropout and inputs included, then follow); `randomize` draws every variable; `source_greedy` runs the greedy loop
of the tutorial's ``Translator`` on a source model.
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf


@contextlib.contextmanager
def float_policy(dtype: str):
    """Build in ``dtype``: the dtype policy (every layer) and floatx (``keras.Input``'s default: a
    float32 input to a float64 model would round the encoder's output and, converting it, drop its
    padding mask)."""
    previous, floatx = keras.config.dtype_policy(), keras.config.floatx()
    keras.config.set_dtype_policy(dtype)
    keras.config.set_floatx(dtype)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
        keras.config.set_floatx(floatx)


def randomize(model: keras.Model, seed: int) -> keras.Model:
    """Every variable drawn: kernels and tables U(-0.5, 0.5), layer-norm gains U(0.5, 1.5), biases
    and offsets U(-0.2, 0.2), so that a swapped or ignored tensor changes the output."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.path.endswith("gamma"):
            value = rng.uniform(0.5, 1.5, v.shape)
        elif len(v.shape) == 1 or v.path.endswith("bias"):
            value = rng.uniform(-0.2, 0.2, v.shape)
        else:
            value = rng.uniform(-0.5, 0.5, v.shape)
        v.assign(value.astype(v.dtype))
    return model


# -- the TensorFlow text tutorial -------------------------------------------------------------------
def positional_encoding(length: int, depth: int, dtype) -> tf.Tensor:
    """The tutorial's table: [sin | cos] of ``p / 10000**(i / (depth/2))``, built in NumPy float64."""
    half = depth / 2
    positions = np.arange(length)[:, np.newaxis]  # (seq, 1)
    depths = np.arange(half)[np.newaxis, :] / half  # (1, depth/2)
    angle_rads = positions * (1 / (10000 ** depths))  # (seq, depth/2)
    return tf.cast(np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1), dtype)


class PositionalEmbedding(keras.layers.Layer):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.embedding = keras.layers.Embedding(vocab_size, d_model, mask_zero=True)
        self.pos_encoding = positional_encoding(2048, d_model, self.compute_dtype)

    def compute_mask(self, *args, **kwargs):
        return self.embedding.compute_mask(*args, **kwargs)

    def call(self, x):
        length = tf.shape(x)[1]
        x = self.embedding(x)
        x *= tf.math.sqrt(tf.cast(self.d_model, self.compute_dtype))
        return x + self.pos_encoding[tf.newaxis, :length, :]


class BaseAttention(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__()
        self.mha = keras.layers.MultiHeadAttention(**kwargs)
        self.layernorm = keras.layers.LayerNormalization()
        self.add = keras.layers.Add()


class CrossAttention(BaseAttention):
    def call(self, x, context):
        attn_output, attn_scores = self.mha(query=x, key=context, value=context,
                                            return_attention_scores=True)
        self.last_attn_scores = attn_scores
        return self.layernorm(self.add([x, attn_output]))


class GlobalSelfAttention(BaseAttention):
    def call(self, x):
        return self.layernorm(self.add([x, self.mha(query=x, value=x, key=x)]))


class CausalSelfAttention(BaseAttention):
    def call(self, x):
        return self.layernorm(self.add([x, self.mha(query=x, value=x, key=x, use_causal_mask=True)]))


class FeedForward(keras.layers.Layer):
    def __init__(self, d_model: int, dff: int, dropout_rate: float = 0.1):
        super().__init__()
        self.seq = keras.Sequential([keras.layers.Dense(dff, activation="relu"),
                                     keras.layers.Dense(d_model), keras.layers.Dropout(dropout_rate)])
        self.add = keras.layers.Add()
        self.layer_norm = keras.layers.LayerNormalization()

    def call(self, x):
        return self.layer_norm(self.add([x, self.seq(x)]))


class EncoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1):
        super().__init__()
        self.self_attention = GlobalSelfAttention(num_heads=num_heads, key_dim=d_model,
                                                  dropout=dropout_rate)
        self.ffn = FeedForward(d_model, dff)

    def call(self, x):
        return self.ffn(self.self_attention(x))


class Encoder(keras.layers.Layer):
    def __init__(self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1):
        super().__init__()
        self.d_model, self.num_layers = d_model, num_layers
        self.pos_embedding = PositionalEmbedding(vocab_size=vocab_size, d_model=d_model)
        self.enc_layers = [EncoderLayer(d_model=d_model, num_heads=num_heads, dff=dff,
                                        dropout_rate=dropout_rate) for _ in range(num_layers)]
        self.dropout = keras.layers.Dropout(dropout_rate)

    def call(self, x):
        x = self.dropout(self.pos_embedding(x))  # (batch, seq, d_model)
        for i in range(self.num_layers):
            x = self.enc_layers[i](x)
        return x


class DecoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1):
        super().__init__()
        self.causal_self_attention = CausalSelfAttention(num_heads=num_heads, key_dim=d_model,
                                                         dropout=dropout_rate)
        self.cross_attention = CrossAttention(num_heads=num_heads, key_dim=d_model,
                                              dropout=dropout_rate)
        self.ffn = FeedForward(d_model, dff)

    def call(self, x, context):
        x = self.causal_self_attention(x=x)
        x = self.cross_attention(x=x, context=context)
        self.last_attn_scores = self.cross_attention.last_attn_scores
        return self.ffn(x)


class Decoder(keras.layers.Layer):
    def __init__(self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1):
        super().__init__()
        self.d_model, self.num_layers = d_model, num_layers
        self.pos_embedding = PositionalEmbedding(vocab_size=vocab_size, d_model=d_model)
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.dec_layers = [DecoderLayer(d_model=d_model, num_heads=num_heads, dff=dff,
                                        dropout_rate=dropout_rate) for _ in range(num_layers)]
        self.last_attn_scores = None

    def call(self, x, context):
        x = self.dropout(self.pos_embedding(x))  # (batch, tgt_len, d_model)
        for i in range(self.num_layers):
            x = self.dec_layers[i](x, context)
        self.last_attn_scores = self.dec_layers[-1].last_attn_scores
        return x


class TutorialTransformer(keras.Model):
    """The tutorial's ``Transformer``: ``model((context, x))`` -> logits (batch, tgt_len, vocab)."""

    def __init__(self, *, num_layers, d_model, num_heads, dff, input_vocab_size, target_vocab_size,
                 dropout_rate=0.1):
        super().__init__()
        self.encoder = Encoder(num_layers=num_layers, d_model=d_model, num_heads=num_heads, dff=dff,
                               vocab_size=input_vocab_size, dropout_rate=dropout_rate)
        self.decoder = Decoder(num_layers=num_layers, d_model=d_model, num_heads=num_heads, dff=dff,
                               vocab_size=target_vocab_size, dropout_rate=dropout_rate)
        self.final_layer = keras.layers.Dense(target_vocab_size)

    def call(self, inputs):
        context, x = inputs
        context = self.encoder(context)
        x = self.decoder(x, context)
        logits = self.final_layer(x)
        try:
            del logits._keras_mask  # the tutorial drops the mask so it does not scale the loss
        except AttributeError:
            pass
        return logits


# -- KerasHub ---------------------------------------------------------------------------------------
def keras_hub_model(src_vocab: int, tgt_vocab: int, max_len: int, d: int, heads: int, ff: int,
                    n_enc: int = 1, n_dec: int = 1, mask_zero: bool = False, nested: bool = True,
                    **layer_args) -> keras.Model:
    """The keras.io example's model (``layer_args``: dropout, activation, normalize_first,
    layer_norm_epsilon of every TransformerEncoder/Decoder); outputs softmax probabilities."""
    import keras_hub

    enc_in = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
    x = keras_hub.layers.TokenAndPositionEmbedding(src_vocab, max_len, d, mask_zero=mask_zero)(enc_in)
    for _ in range(n_enc):
        x = keras_hub.layers.TransformerEncoder(intermediate_dim=ff, num_heads=heads, **layer_args)(inputs=x)
    dec_in = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
    state = keras.Input(shape=(None, d), name="decoder_state_inputs") if nested else x
    y = keras_hub.layers.TokenAndPositionEmbedding(tgt_vocab, max_len, d, mask_zero=mask_zero)(dec_in)
    for _ in range(n_dec):
        y = keras_hub.layers.TransformerDecoder(intermediate_dim=ff, num_heads=heads, **layer_args)(
            decoder_sequence=y, encoder_sequence=state)
    y = keras.layers.Dropout(0.5)(y)
    out = keras.layers.Dense(tgt_vocab, activation="softmax")(y)
    if nested:
        decoder = keras.Model([dec_in, state], out)
        out = decoder([dec_in, x])
    return keras.Model([enc_in, dec_in], out, name="transformer")


# -- greedy decoding on a source model ----------------------------------------------------------------
def source_greedy(next_scores, src: np.ndarray, start: int, eos: int, pad: int, max_new: int) -> np.ndarray:
    """Greedy decoding driven by ``next_scores(src, prefix) -> (B, V)`` scores of the next token (the
    source model run on the whole prefix, as the tutorial's ``Translator`` and the keras.io example
    do). The project's rules (docs/design.md, section 7): pad is never chosen, ties go to the lowest
    id (``np.argmax``), a row that emitted EOS continues with pad. Returns ``(B, max_new)`` tokens."""
    prefix = np.full((len(src), 1), start, dtype=src.dtype)
    done = np.zeros(len(src), dtype=bool)
    out = np.full((len(src), max_new), pad, dtype=np.int64)
    for t in range(max_new):
        scores = np.array(next_scores(src, prefix), dtype=np.float64)
        scores[:, pad] = -np.inf
        token = np.where(done, pad, np.argmax(scores, axis=-1))
        out[:, t] = token
        done |= token == eos
        prefix = np.concatenate([prefix, token[:, None].astype(src.dtype)], axis=1)
        if done.all():
            break
    return out
