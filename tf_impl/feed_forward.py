"""The position-wise feed-forward network: linear, activation, dropout, linear (docs/design.md,
conventions 8 and 15; the activation is ``config.activation``: relu, exact gelu, or swish)."""
from __future__ import annotations

import math

import keras
import tensorflow as tf

from .cache import dense
from .inputs import check_training


def _gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``, written out: ``tf.nn.gelu(approximate=False)``
    is not that formula to float64 precision in TF 2.21 (measured on CPU: 5.0e-9 from the erf
    formula on [-5, 5] in float64, where ``tf.math.erf`` and ``torch.nn.functional.gelu`` are within
    4.4e-16), which would break the 1e-12 float64 parity."""
    return 0.5 * x * (1.0 + tf.math.erf(x * tf.constant(1.0 / math.sqrt(2.0), x.dtype)))


ACTIVATIONS = {
    "relu": tf.nn.relu,  # what Dense(activation="relu") applies
    "gelu": _gelu,  # exact (erf), as the reference
    "swish": tf.nn.silu,  # x * sigmoid(x)
}


class FeedForward(keras.layers.Layer):
    """``outer(dropout(activation(inner(x))))``.

    Args:
        d_model: input and output width; d_ff: inner width; dropout: probability inside (training only).
        activation: a key of `ACTIVATIONS` (``config.activation``).

    Shape:
        ``(B, L, d_model)`` -> ``(B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu", **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"FeedForward: activation expected one of {tuple(ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.d_model, self.d_ff, self.rate = d_model, d_ff, float(dropout)
        self.activation_name, self.activation = activation, ACTIVATIONS[activation]
        self.inner = keras.layers.Dense(d_ff, dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.inner.build((None, d_model))
        self.outer.build((None, d_ff))
        self.built = True

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        check_training(training)
        hidden = self.activation(self.inner(x))  # (B, L, d_ff)
        return self.outer(self.dropout(hidden, training=training))

    def step_kernels(self) -> tuple[tf.Tensor, ...]:
        """``(inner kernel (d, d_ff), bias, outer kernel (d_ff, d), bias)`` (`tf_impl.cache.StepWeights`)."""
        return tuple(tf.convert_to_tensor(w) for w in (self.inner.kernel, self.inner.bias,
                                                       self.outer.kernel, self.outer.bias))

    def step(self, x: tf.Tensor, inner: tuple | None, outer: tuple | None) -> tf.Tensor:
        """`call` in inference, as a decoding step runs it, with the kernels of `step_kernels`: no
        dropout, no layer calls. Same shapes, same values to rounding. With the kernels None (a
        model not as built: `tf_impl.cache._as_built`), `call`."""
        if inner is None:
            return self(x)
        return dense(self.activation(dense(x, *inner)), *outer)

    def get_config(self) -> dict:
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff, "dropout": self.rate,
                "activation": self.activation_name}
