"""Attention masks, one convention for every implementation (docs/design.md, conventions 2 and 3).

A mask is boolean and ``True`` means **may attend**. Masks broadcast to
``(batch, heads, q_len, k_len)``:

* source mask ``(batch, 1, 1, src_len)``: ``src != pad_id`` (keys that are not padding);
* target mask ``(batch, 1, tgt_len, tgt_len)``: target padding AND the subsequent (causal) mask.

Only the *keys* are masked for padding; a padded query row still computes something, and a row with
no allowed key at all (an all-padding sequence) gets all-zero weights and a zero output.
A backend converts to another convention only at the call of a framework op that needs it.
"""
from __future__ import annotations

import numpy as np


def _check_ids(name: str, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer token ids, got dtype {ids.dtype}")
    return ids


def subsequent_mask(size: int) -> np.ndarray:
    """``(1, 1, size, size)`` bool, lower-triangular: query ``i`` may attend keys ``0..i`` (itself included)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"subsequent_mask: size expected a positive int, got {size!r}")
    return np.tril(np.ones((size, size), dtype=bool))[None, None]


def padding_mask(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """``(batch, 1, 1, seq)`` bool: ``True`` where the key token is not padding."""
    ids = _check_ids("ids", ids)
    return (ids != pad_id)[:, None, None, :]


def make_src_mask(src: np.ndarray, pad_id: int) -> np.ndarray:
    """Source mask ``(batch, 1, 1, src_len)`` from source ids ``(batch, src_len)``."""
    return padding_mask(_check_ids("src", src), pad_id)


def make_tgt_mask(tgt: np.ndarray, pad_id: int) -> np.ndarray:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: key is not padding AND key position <= query position."""
    tgt = _check_ids("tgt", tgt)
    return padding_mask(tgt, pad_id) & subsequent_mask(tgt.shape[1])
