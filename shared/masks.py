"""Attention masks, one convention for every implementation (docs/design.md, conventions 2 and 3).

A mask is boolean and ``True`` means **may attend**. Masks broadcast to
``(batch, heads, q_len, k_len)``:

* source mask ``(batch, 1, 1, src_len)``: ``src != pad_id`` (keys that are not padding);
* target mask ``(batch, 1, tgt_len, tgt_len)``: target padding AND the subsequent (causal) mask.
  When the decoder starts from the pad token (``config.decoder_start_id == pad_id``, Marian), the
  rule is: **column 0 is always a real token; padding is derived from ``tgt != pad_id`` for
  positions 1.. only** (`start_is_pad`, ``first_is_real=True``). Otherwise every column, the first
  included, is padding where it equals ``pad_id``, as before.

With ``config.mask_padding=False`` (KerasHub without ``mask_zero``) padding is not masked at all:
call sites pass ``pad_id=None`` (`padding_id(config)`), giving an all-True source mask and the
subsequent mask alone for the target.

Only the *keys* are masked for padding; a padded query row still computes something, and a row with
no allowed key at all (an all-padding sequence) gets all-zero weights and a zero output.
A backend converts to another convention only at the call of a framework op that needs it.
"""
from __future__ import annotations

import numpy as np

from .config import TransformerConfig


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


def padding_id(config: TransformerConfig) -> int | None:
    """The id the default masks hide: ``config.pad_id``, or ``None`` when ``config.mask_padding`` is
    False (padding is then an ordinary token). Pass it as ``pad_id`` to the ``make_*_mask`` helpers
    here and in both backends."""
    return config.pad_id if config.mask_padding else None


def make_src_mask(src: np.ndarray, pad_id: int | None) -> np.ndarray:
    """Source mask ``(batch, 1, 1, src_len)`` from source ids ``(batch, src_len)``; all True when
    ``pad_id`` is None (`padding_id`)."""
    src = _check_ids("src", src)
    if pad_id is None:
        return np.ones((src.shape[0], 1, 1, src.shape[1]), dtype=bool)
    return padding_mask(src, pad_id)


def start_is_pad(config: TransformerConfig) -> bool:
    """Whether decoding starts from the pad token (``config.start_id == pad_id``): the target mask
    must then not hide column 0 (``first_is_real`` of `make_tgt_mask`, here and in both backends)."""
    return config.start_id == config.pad_id


def make_tgt_mask(tgt: np.ndarray, pad_id: int | None, first_is_real: bool = False) -> np.ndarray:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: key is not padding AND key position <= query position.

    ``first_is_real`` (pass `start_is_pad(config)`): column 0 is the decoder start token, a real
    key even when it equals ``pad_id``; padding is then derived from ``tgt != pad_id`` for
    positions 1.. only. ``pad_id=None`` (`padding_id`): the subsequent mask alone, per row."""
    tgt = _check_ids("tgt", tgt)
    if pad_id is None:
        return np.broadcast_to(subsequent_mask(tgt.shape[1]), (tgt.shape[0], 1) + (tgt.shape[1],) * 2).copy()
    keys = padding_mask(tgt, pad_id)  # (B, 1, 1, T)
    if first_is_real:
        keys = keys | (np.arange(tgt.shape[1]) == 0)
    return keys & subsequent_mask(tgt.shape[1])
