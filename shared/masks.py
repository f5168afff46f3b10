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

import math
from typing import Sequence

import numpy as np

from .checks import batch_ids, check_config, check_flag, dtype_name, is_int, refusal
from .config import POSITIONAL_TABLE_LIMIT, TransformerConfig
from .messages import shown

# The longest causal mask `subsequent_mask` and `make_tgt_mask` build: length * length <=
# POSITIONAL_TABLE_LIMIT values, the bound the config puts on the positional table. At that length
# one head's attention scores in the float64 reference are already 2 GiB, so nothing the reference
# can run needs more; past it a length is refused by name instead of failing as a MemoryError (or a
# swap storm) inside NumPy. (The largest max_len a config allows, 2**28 with d_model=1, bounds
# nothing here: its mask would be 2**56 bytes.)
SUBSEQUENT_MASK_LIMIT = math.isqrt(POSITIONAL_TABLE_LIMIT)  # 16384


def check_pad_id(pad_id) -> None:
    """``pad_id`` of every ``make_*_mask`` helper (here and in both backends, which call this, so the
    three refuse alike): an int, or None for "no padding" (`padding_id`). Anything else would be
    compared element-wise and silently mask nothing ("0", 0.5, NaN), mask id 1 (True) or broadcast
    (a list), so it is refused before any mask is computed."""
    if pad_id is not None and not is_int(pad_id):
        raise TypeError(f"pad_id: expected an int (the padding id) or None (no padding masked), "
                        f"got {shown(pad_id)}")


def check_mask_ids(name: str, shape: Sequence, dtype: str, is_integer: bool) -> None:
    """The ids a ``make_*_mask`` helper reads, here and in both backends (which call this, so the
    three refuse alike): ``(batch, seq)``, of an integer dtype (bool is none); empty allowed."""
    if len(shape) != 2:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got shape {tuple(shape)}")
    if not is_integer:
        raise TypeError(f"{name}: expected integer token ids, got dtype {dtype}")


def _check_ids(name: str, ids) -> np.ndarray:
    """``ids`` as a NumPy array, read as tf_impl's helpers read a non-tensor (`batch_ids`: ragged
    rows, None, objects and text named as every implementation names them), of rank 2 and an
    integer dtype (`check_mask_ids`)."""
    ids = batch_ids(name, ids)
    check_mask_ids(name, ids.shape, dtype_name(ids), ids.dtype.kind in "iu")
    return ids


def subsequent_mask(size: int) -> np.ndarray:
    """``(1, 1, size, size)`` bool, lower-triangular: query ``i`` may attend keys ``0..i`` (itself
    included). ``1 <= size <= SUBSEQUENT_MASK_LIMIT``."""
    if not is_int(size) or size < 1:
        raise refusal(is_int(size))(f"subsequent_mask: size expected a positive int, got {shown(size)}")
    return _causal(size, "subsequent_mask: size")


def _causal(length: int, name: str) -> np.ndarray:
    """``(1, 1, length, length)`` lower-triangular bool, empty for ``length`` 0 (an empty target's
    mask is empty, as in both backends); longer than `SUBSEQUENT_MASK_LIMIT` is refused naming
    ``name``, before anything is allocated."""
    if length > SUBSEQUENT_MASK_LIMIT:
        raise ValueError(f"{name} expected at most {SUBSEQUENT_MASK_LIMIT} positions (a causal mask of "
                         f"at most POSITIONAL_TABLE_LIMIT = {POSITIONAL_TABLE_LIMIT} values), "
                         f"got {shown(length, str)}")
    return np.tril(np.ones((length, length), dtype=bool))[None, None]


def padding_mask(ids: np.ndarray, pad_id: int | None) -> np.ndarray:
    """``(batch, 1, 1, seq)`` bool: ``True`` where the key token is not padding; all True when
    ``pad_id`` is None."""
    check_pad_id(pad_id)
    ids = _check_ids("ids", ids)
    if pad_id is None:
        return np.ones((ids.shape[0], 1, 1, ids.shape[1]), dtype=bool)
    return (ids != pad_id)[:, None, None, :]


def padding_id(config: TransformerConfig) -> int | None:
    """The id the default masks hide: ``config.pad_id``, or ``None`` when ``config.mask_padding`` is
    False (padding is then an ordinary token). Pass it as ``pad_id`` to the ``make_*_mask`` helpers
    here and in both backends."""
    check_config(config)
    return config.pad_id if config.mask_padding else None


def make_src_mask(src: np.ndarray, pad_id: int | None) -> np.ndarray:
    """Source mask ``(batch, 1, 1, src_len)`` from source ids ``(batch, src_len)``; all True when
    ``pad_id`` is None (`padding_id`). An empty ``src`` gives an empty mask."""
    check_pad_id(pad_id)
    src = _check_ids("src", src)
    return padding_mask(src, pad_id)


def start_is_pad(config: TransformerConfig) -> bool:
    """Whether decoding starts from the pad token (``config.start_id == pad_id``): the target mask
    must then not hide column 0 (``first_is_real`` of `make_tgt_mask`, here and in both backends)."""
    check_config(config)
    return config.start_id == config.pad_id


def make_tgt_mask(tgt: np.ndarray, pad_id: int | None, first_is_real: bool = False) -> np.ndarray:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: key is not padding AND key position <= query position.

    ``first_is_real`` (pass `start_is_pad(config)`): column 0 is the decoder start token, a real
    key even when it equals ``pad_id``; padding is then derived from ``tgt != pad_id`` for
    positions 1.. only. ``pad_id=None`` (`padding_id`): the subsequent mask alone, per row. An
    empty ``tgt`` (length 0) gives an empty mask, as `make_src_mask` and both backends do."""
    check_pad_id(pad_id)
    check_flag(first_is_real, "first_is_real")  # "no" read for its truth made column 0 real
    tgt = _check_ids("tgt", tgt)
    causal = _causal(tgt.shape[1], "tgt:")  # (1, 1, T, T); checks the length before any work
    keys = padding_mask(tgt, pad_id)  # (B, 1, 1, T), all True when pad_id is None
    if first_is_real:
        keys = keys | (np.arange(tgt.shape[1]) == 0)
    return keys & causal
