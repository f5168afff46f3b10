"""Sinusoidal positional encoding, computed once in float64 for every implementation.

One function builds the table for every layout, timescale and offset of `TransformerConfig`
(docs/design.md, conventions 4 and 15). With ``f_i`` the inverse frequency of pair ``i`` and
``q = p + offset`` the position index of row ``p``::

    interleaved (the paper, the Annotated Transformer; the default):
        PE[p, 2i] = sin(q * f_i)          PE[p, 2i + 1] = cos(q * f_i)
    halves (``[sin | cos]``: Marian, the TensorFlow text tutorial, fairseq):
        PE[p, i]  = sin(q * f_i)          PE[p, d/2 + i] = cos(q * f_i)        i < d/2

    paper timescale (the default):  f_i = 10000^(-2i / d)
    t2t timescale (tensor2tensor, fairseq):  f_i = exp(-i * ln(10000) / (d/2 - 1)),
        so f_0 = 1 and f_{d/2 - 1} = 1e-4

``offset`` (``config.pe_offset``) is the position index of the first token: fairseq counts
positions from ``pad_id + 1``. Learned position tables are weights, not built here
(`shared.weights`).
"""
from __future__ import annotations

import numpy as np

from .checks import check_config, is_int, refusal
from .config import PE_LAYOUTS, PE_TIMESCALES, POSITIONAL_TABLE_LIMIT, TransformerConfig
from .messages import shown


def _check_int(name: str, value, low: int, caller: str = "positional_encoding") -> None:
    if not is_int(value) or value < low:
        kind = "a positive int" if low == 1 else f"an int >= {low}"
        raise refusal(is_int(value))(f"{caller}: {name} expected {kind}, got {shown(value)}")


def _check_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    # A string first: ``value in allowed`` compares with ``==``, which an array answers element-wise
    # ("truth value of an array is ambiguous") and other objects may answer as they like.
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"positional_encoding: {name} expected one of {allowed}, got {shown(value)}")


def inverse_frequencies(d_model: int, timescale: str = "paper") -> np.ndarray:
    """``f_i`` for the ``ceil(d_model / 2)`` sin/cos pairs, float64 (see the module docstring).

    ``t2t`` needs an even ``d_model >= 4`` (`TransformerConfig` refuses others)."""
    # asked for directly too (it is public): an int, and at most the table's bound, or NumPy's
    # arange of 0 or -4 gave an empty array and 2**40 a MemoryError of 4 TiB
    _check_int("d_model", d_model, 1, "inverse_frequencies")
    if d_model > POSITIONAL_TABLE_LIMIT:
        raise ValueError(f"inverse_frequencies: d_model expected at most POSITIONAL_TABLE_LIMIT = "
                         f"{POSITIONAL_TABLE_LIMIT}, got {shown(d_model, str)}")
    _check_choice("timescale", timescale, PE_TIMESCALES)
    if timescale == "paper":
        two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
        return np.power(10000.0, -two_i / d_model)
    half = d_model // 2
    if d_model % 2 or half < 2:
        raise ValueError(f"positional_encoding: d_model expected an even int >= 4 with timescale "
                         f"'t2t' (its frequencies divide by d_model / 2 - 1), got {shown(d_model, str)}")
    return np.exp(np.arange(half, dtype=np.float64) * -(np.log(10000.0) / (half - 1)))


def positional_encoding(max_len: int, d_model: int, layout: str = "interleaved",
                        timescale: str = "paper", offset: int = 0) -> np.ndarray:
    """The table of shape ``(max_len, d_model)``, float64.

    Row ``p`` is added to the (scaled) embedding of the token at position ``p``. Each sin/cos pair
    of columns is a point on the unit circle turning at angular frequency ``f_i``, so
    ``PE[p + k]`` is ``PE[p]`` rotated by a fixed angle per pair; ``offset`` shifts the rows
    (row ``p`` of offset ``k`` is row ``p + k`` of offset 0). With the interleaved layout an odd
    ``d_model`` keeps its last sine column without a cosine partner; ``halves`` needs an even one.
    """
    _check_int("max_len", max_len, 1)
    _check_int("d_model", d_model, 1)
    _check_int("offset", offset, 0)
    # Python ints from here: a NumPy int8 ``max_len`` met ``2**53`` below in its own width
    # (NumPy's OverflowError, naming nothing), and a product of NumPy ints could wrap around.
    max_len, d_model, offset = int(max_len), int(d_model), int(offset)
    # The config's bound on the table (`TransformerConfig.max_len`), for a table asked for directly:
    # past it, a refusal by name rather than a MemoryError inside NumPy.
    size = max_len * d_model
    if size > POSITIONAL_TABLE_LIMIT:
        raise ValueError(f"positional_encoding: max_len expected max_len * d_model <= "
                         f"POSITIONAL_TABLE_LIMIT = {POSITIONAL_TABLE_LIMIT} (the float64 table, 2 GiB), "
                         f"got {shown(max_len, str)} * {shown(d_model, str)} = {shown(size, str)}")
    if offset > 2**53 - max_len + 1:  # as `TransformerConfig.pe_offset`: rows past it would repeat
        raise ValueError(f"positional_encoding: offset expected an int <= 2**53 - max_len + 1 = "
                         f"{2**53 - max_len + 1} (positions are float64, exact only up to 2**53), "
                         f"got {shown(offset, str)}")
    _check_choice("layout", layout, PE_LAYOUTS)
    _check_choice("timescale", timescale, PE_TIMESCALES)
    if layout == "halves" and d_model % 2:
        raise ValueError(f"positional_encoding: d_model expected an even int with layout 'halves' "
                         f"(two halves of d_model / 2 columns), got {shown(d_model, str)}")
    position = np.arange(offset, offset + max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    angle = position * inverse_frequencies(d_model, timescale)  # (max_len, ceil(d/2))
    table = np.empty((max_len, d_model), dtype=np.float64)
    if layout == "interleaved":
        table[:, 0::2] = np.sin(angle)
        table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    else:
        half = d_model // 2
        table[:, :half] = np.sin(angle)
        table[:, half:] = np.cos(angle)
    return table


def positional_table(config: TransformerConfig) -> np.ndarray:
    """The fixed table ``(config.max_len, config.d_model)`` of a ``positional="sinusoidal"`` config,
    float64: what the reference and both backends add (cast to the model dtype by a backend)."""
    check_config(config)
    if config.positional != "sinusoidal":
        raise ValueError(f"positional_table: expected a config with positional='sinusoidal' (a "
                         f"learned table is a weight), got positional={config.positional!r}")
    return positional_encoding(config.max_len, config.d_model, config.pe_layout,
                               config.pe_timescale, config.pe_offset)
