"""Sinusoidal positional encoding, computed once in float64 for every implementation.

Layout is *interleaved*, as in the paper and the Annotated Transformer (docs/design.md,
convention 4)::

    PE[p, 2i]     = sin(p / 10000^(2i / d_model))
    PE[p, 2i + 1] = cos(p / 10000^(2i / d_model))        positions p counted from 0

The TensorFlow tutorial (since 2022) concatenates ``[sin | cos]`` instead, and tensor2tensor and
fairseq use other frequencies and offsets; weights trained with those cannot be loaded as-is.
"""
from __future__ import annotations

import numpy as np


def positional_encoding(max_len: int, d_model: int) -> np.ndarray:
    """The table of shape ``(max_len, d_model)``, float64.

    Row ``p`` is added to the scaled embedding of the token at position ``p``. Each pair of columns
    ``(2i, 2i+1)`` is a point on the unit circle turning at angular frequency ``10000^(-2i/d)``, so
    ``PE[p + k]`` is ``PE[p]`` rotated by a fixed angle per pair. An odd ``d_model`` keeps its last
    sine column without a cosine partner.
    """
    for name, value in (("max_len", max_len), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"positional_encoding: {name} expected a positive int, got {value!r}")
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
    inv_freq = np.power(10000.0, -two_i / d_model)
    angle = position * inv_freq  # (max_len, ceil(d/2))
    table = np.empty((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return table
