"""Token embeddings scaled by sqrt(d_model), and the sinusoidal positional encoding from `shared`."""
from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from shared import TransformerConfig
from shared.positional import positional_encoding

from .inputs import dims


class TokenEmbedding(keras.layers.Layer):
    """Ids ``(B, L)`` -> vectors ``(B, L, d_model)``, multiplied by ``sqrt(d_model)`` (the paper's
    scaling, which keeps embeddings on the scale of the positional encoding).

    The table is the variable ``embeddings`` ``(vocab, d_model)``; it is also the generator's
    projection when the output is tied.

    An id outside ``[0, vocab)`` is never looked up: its vector is NaN. ``tf.gather`` would raise on
    CPU, return zeros on GPU and clamp under XLA; NaN is the same everywhere and cannot pass for a
    real answer. (`tf_impl.inputs.check_ids` raises before this wherever TF can raise.)
    """

    def __init__(self, vocab: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.d_model = vocab, d_model
        self.scale = math.sqrt(d_model)
        self.embeddings = self.add_weight(name="embeddings", shape=(vocab, d_model),
                                          initializer="glorot_uniform")
        self.built = True

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        if ids.dtype not in (tf.int32, tf.int64):  # gathers take int32/int64 indices only
            ids = tf.cast(ids, tf.int64)
        valid = tf.logical_and(ids >= 0, ids < self.vocab)  # (B, L)
        vectors = tf.gather(self.embeddings, tf.where(valid, ids, tf.zeros_like(ids)))  # (B, L, d)
        vectors = tf.where(valid[..., None], vectors, tf.constant(np.nan, vectors.dtype))
        return vectors * tf.constant(self.scale, vectors.dtype)

    def get_config(self) -> dict:
        return {**super().get_config(), "vocab": self.vocab, "d_model": self.d_model}


class PositionalEncoding(keras.layers.Layer):
    """Adds ``PE[:seq]`` (interleaved sin/cos, docs/design.md, convention 4) and applies dropout.

    The table is computed once in float64 by `shared.positional` and cast to the model dtype; it is
    a constant, not a weight, and is never saved.

    Shape: x ``(B, L, d)`` -> ``(B, L, d)``, ``L <= config.max_len``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        kwargs.setdefault("dtype", config.dtype)
        super().__init__(**kwargs)
        self.config = config
        self.table = tf.constant(positional_encoding(config.max_len, config.d_model).astype(config.dtype))
        self.dropout = keras.layers.Dropout(config.dropout, dtype=config.dtype)
        self.built = True

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.dropout(x + self.table[: dims(x, 2)[1]], training=training)

    def get_config(self) -> dict:
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config: dict) -> "PositionalEncoding":
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)
