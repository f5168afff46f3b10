"""Layer normalisation in the two styles of docs/design.md, convention 6, with ``eps`` always
explicit."""
from __future__ import annotations

import keras
import tensorflow as tf


class LayerNorm(keras.layers.Layer):
    """Normalise the last axis, then scale by ``gamma`` and shift by ``beta``.

    Args:
        d_model: size of the normalised (last) axis.
        style: ``"standard"``: ``(x - mean) / sqrt(var + eps)``, biased variance, as
            ``keras.layers.LayerNormalization`` and torch compute it; ``"annotated"``:
            ``(x - mean) / (std + eps)`` with the unbiased std, as the Annotated Transformer's own
            LayerNorm does.
        eps: the epsilon; never a framework default (Keras uses 1e-3, torch 1e-5).

    Shape:
        ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, style: str, eps: float, **kwargs):
        super().__init__(**kwargs)
        if style not in ("standard", "annotated"):
            raise ValueError(f"LayerNorm: style expected 'standard' or 'annotated', got {style!r}")
        self.d_model, self.style, self.eps = d_model, style, float(eps)
        self.gamma = self.add_weight(name="gamma", shape=(d_model,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(d_model,), initializer="zeros")
        self.built = True

    def call(self, x: tf.Tensor) -> tf.Tensor:
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        if self.style == "standard":
            var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)  # biased
            normed = centered * tf.math.rsqrt(var + self.eps)
        else:
            # d_model - 1 as a constant, not from the tensor's shape: a graph whose shapes were
            # known folded it into one, where unknown ones left a division, so a tf.function
            # rounded the norm one way or another by the sizes it was traced for.
            std = tf.sqrt(tf.reduce_sum(tf.square(centered), axis=-1, keepdims=True) / float(self.d_model - 1))
            normed = centered / (std + self.eps)
        return normed * self.gamma + self.beta

    def get_config(self) -> dict:
        return {**super().get_config(), "d_model": self.d_model, "style": self.style, "eps": self.eps}
