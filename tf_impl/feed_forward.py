"""The position-wise feed-forward network: linear, ReLU, dropout, linear (docs/design.md,
convention 8)."""
from __future__ import annotations

import keras
import tensorflow as tf


class FeedForward(keras.layers.Layer):
    """``outer(dropout(relu(inner(x))))``.

    Args:
        d_model: input and output width; d_ff: inner width; dropout: probability inside (training only).

    Shape:
        ``(B, L, d_model)`` -> ``(B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.rate = d_model, d_ff, float(dropout)
        self.inner = keras.layers.Dense(d_ff, activation="relu", dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.inner.build((None, d_model))
        self.outer.build((None, d_ff))
        self.built = True

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.outer(self.dropout(self.inner(x), training=training))  # (B, L, d_ff) inside

    def get_config(self) -> dict:
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff, "dropout": self.rate}
