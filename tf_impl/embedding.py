"""Token embeddings (scaled by sqrt(d_model) unless the config says not), their learned position
tables when ``config.positional == "learned"``, and the positional encoding that adds either table."""
from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from shared import TransformerConfig
from shared.positional import positional_table

from .inputs import check_training, dims


class TokenEmbedding(keras.layers.Layer):
    """Ids ``(B, L)`` -> vectors ``(B, L, d_model)``, multiplied by ``sqrt(d_model)`` when ``scale``
    (the paper's scaling, which keeps embeddings on the scale of the positional encoding; keras-hub
    models do not scale).

    The table is the variable ``embeddings`` ``(vocab, d_model)``; it is also the generator's
    projection when the output is tied. With ``max_len`` (learned positions) the variable
    ``positions`` ``(max_len, d_model)`` is this side's position table (canonical
    ``{src,tgt}_embed.positions``), added by `PositionalEncoding`; otherwise ``positions`` is None.

    An id outside ``[0, vocab)`` is never looked up: its vector is NaN. ``tf.gather`` would raise on
    CPU, return zeros on GPU and clamp under XLA; NaN is the same everywhere and cannot pass for a
    real answer. (`tf_impl.inputs.check_ids` raises before this wherever TF can raise.)
    """

    def __init__(self, vocab: int, d_model: int, scale: bool = True, max_len: int | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.d_model, self.max_len = vocab, d_model, max_len
        self.scale = math.sqrt(d_model) if scale else None
        self.embeddings = self.add_weight(name="embeddings", shape=(vocab, d_model),
                                          initializer="glorot_uniform")
        self.positions = (self.add_weight(name="positions", shape=(max_len, d_model),
                                          initializer="glorot_uniform")
                          if max_len is not None else None)
        self.built = True

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        if ids.dtype not in (tf.int32, tf.int64):  # gathers take int32/int64 indices only
            ids = tf.cast(ids, tf.int64)
        valid = tf.logical_and(ids >= 0, ids < self.vocab)  # (B, L)
        vectors = tf.gather(self.embeddings, tf.where(valid, ids, tf.zeros_like(ids)))  # (B, L, d)
        vectors = tf.where(valid[..., None], vectors, tf.constant(np.nan, vectors.dtype))
        return vectors * tf.constant(self.scale, vectors.dtype) if self.scale is not None else vectors

    def get_config(self) -> dict:
        return {**super().get_config(), "vocab": self.vocab, "d_model": self.d_model,
                "scale": self.scale is not None, "max_len": self.max_len}


class PositionalEncoding(keras.layers.Layer):
    """Adds a positional table's rows ``[:seq]`` and applies dropout.

    The fixed table (``config.positional == "sinusoidal"``; layout, timescale and offset from the
    config, docs/design.md, conventions 4 and 15) is computed once in float64 by `shared.positional`
    and cast to the model dtype; it is a constant, not a weight, and is never saved. With learned
    positions ``table`` is None and the caller passes the embedding's ``positions``.

    Shape: x ``(B, L, d)`` -> ``(B, L, d)``, ``L <= config.max_len``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        kwargs.setdefault("dtype", config.dtype)
        super().__init__(**kwargs)
        self.config = config
        self.table = None
        if config.positional == "sinusoidal":
            self.table = tf.constant(positional_table(config).astype(config.dtype))
        self.dropout = keras.layers.Dropout(config.dropout, dtype=config.dtype)
        self.built = True

    def select(self, positions: tf.Variable | None):
        """The table to add: ``positions`` (a learned ``(max_len, d)`` table) or the fixed one."""
        return self.table if positions is None else positions

    def call(self, x: tf.Tensor, positions: tf.Variable | None = None,
             training: bool = False) -> tf.Tensor:
        """x ``(B, L, d)`` -> ``(B, L, d)``; ``positions``: see `select`."""
        check_training(training)
        table, length = self.select(positions), dims(x, 2)[1]
        if not isinstance(length, int):
            # A length known only at run time (a relaxed-shape graph) may exceed max_len: the input
            # check raises in graph mode, and under XLA poisons the outputs (NaN, `inputs.guarded`),
            # which needs the rows to have x's shape. Clamped positions give it (rows past the table
            # repeat its last row; those outputs are NaN anyway) where a slice would stop at max_len
            # and fail with XLA's "Incompatible shapes".
            return self.dropout(x + tf.gather(table, tf.minimum(tf.range(length), table.shape[0] - 1)),
                                training=training)
        return self.dropout(x + table[:length], training=training)

    def get_config(self) -> dict:
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config: dict) -> "PositionalEncoding":
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)
