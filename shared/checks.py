"""Input checks shared by every implementation, so a bad input fails the same way everywhere.

The functions take only metadata (shapes, dtype names, min/max ids), so NumPy, PyTorch and
TensorFlow backends call the very same code and raise the very same messages:
``TypeError`` for a wrong dtype, ``ValueError`` for a wrong rank, shape, length or id value.

A scalar argument follows Python's own rule (`refusal`): ``TypeError`` for a value of the wrong
type (``max_len=2.0``, ``beam_size=None``), ``ValueError`` for one of the right type out of range
(``max_len=0``), the message the same either way. A configuration is data, not an argument:
`TransformerConfig` refuses every bad field with a ``ValueError``, as a file's reader does.
"""
from __future__ import annotations

import argparse
import numbers
import re
from typing import Sequence

import numpy as np

from .config import TransformerConfig  # imports nothing of the project's: no cycle
from .messages import shown


def is_int(value) -> bool:
    """A Python or NumPy integer, not a bool (``True`` is an ``int`` to Python, and no count) and
    not a NumPy ``timedelta64`` (a duration: NumPy counts it an integer, and ``int()`` of one with
    a unit makes a ``datetime.timedelta``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.timedelta64))


def is_real(value) -> bool:
    """A Python or NumPy real number (an int or a float), not a bool and not a NumPy
    ``timedelta64`` (`is_int`)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.timedelta64))


def refusal(right_type: bool) -> type[TypeError] | type[ValueError]:
    """The class of error for a refused argument: ``ValueError`` where its type was right (its value
    is out of range), ``TypeError`` where it was not. ``raise refusal(is_int(n))(message)``."""
    return ValueError if right_type else TypeError


def check_seed(seed, name: str = "seed") -> None:
    """A seed is an int >= 0 (NumPy ints too; not a bool). None is refused: NumPy would draw fresh
    entropy, and what the project seeds is promised to be deterministic in its seed."""
    if not is_int(seed):
        raise TypeError(f"{name}: expected an int >= 0, got {shown(seed)}")
    if seed < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {shown(seed, str)}")


def check_flag(value, name: str) -> None:
    """A flag is True or False (a NumPy bool too). Anything else is refused rather than read for
    its truth: ``allow_nonfinite="no"`` is a true string, and would load NaN weights."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {shown(value)} ({type(value).__name__})")


def check_step_kernels(qkv, output) -> None:
    """`MultiHeadAttention.extend`'s ``qkv`` and ``output`` (a step's kernels, `step_kernels`),
    both or neither, in both backends: ``output`` alone was ignored (the layer's own projections
    ran), ``qkv`` alone failed in Python's words ("Value after * must be an iterable")."""
    if (qkv is None) != (output is None):
        got = "output without qkv" if qkv is None else "qkv without output"
        raise ValueError(f"output: the step's output kernel goes with its qkv kernels; got {got}")


def check_position(position, capacity: int, mask=None) -> None:
    """A cached step's ``position`` given as a number (`MultiHeadAttention.extend`,
    `DecoderLayer.step`; a tensor position, a CUDA graph's or a compiled step's, is its caller's):
    an int in ``[0, capacity)``, the same in both backends. torch wrote -1 into the last slot and
    attended to it alone; TF wrote 2.7 at 2 and True at 1. ``mask``, the step's ``filled_mask``,
    goes with a tensor position only: torch ignored one given with an int position, TF applied it."""
    if not is_int(position) or not 0 <= position < capacity:
        raise refusal(is_int(position))(f"position: expected an int in [0, {capacity}) (the cache's "
                                        f"capacity), got {position!r}")
    if mask is not None:
        raise ValueError(f"mask: expected None with an int position ({position}: the step attends to "
                         "positions 0 .. position; a filled_mask goes with a tensor position), got a mask")


def check_config(config, name: str = "config") -> None:
    """A `TransformerConfig`, checked before any of its fields is read (None or a dict would fail
    later as an ``AttributeError`` naming a field, not the argument)."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"{name}: expected a TransformerConfig, got {type(config).__name__}")


def int_argument(text: str, low: int | None = None, high: int | None = None) -> int:
    """An ``argparse`` type's int of at least ``low`` (and at most ``high``; neither: any int):
    argparse's usage error (exit 2, ``argument --seed: expected an int >= 0, got -1``) for anything
    else, while the command line is parsed. Only an optional sign and ASCII digits are an int here,
    as ``twins decode --src`` reads token ids: ``int()`` also takes ``"1_0"`` (10), other scripts'
    digits (``"\u0663"``, 3) and surrounding spaces, so a typo or a pasted character ran as a count."""
    if low is None:
        expected = "an int" if high is None else f"an int <= {high}"
    else:
        expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
    quoted = repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise argparse.ArgumentTypeError(f"expected {expected} (ASCII digits), got {quoted}")
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts (4300)
        raise argparse.ArgumentTypeError(f"expected {expected}, got {quoted}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        got = value if len(text) <= 80 else f"{text[:80]}... ({len(text):,} characters)"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {got}")
    return value


def _sizes(shape: Sequence) -> tuple:
    """``shape`` as a tuple of ints. A symbolic size (torch's ``SymInt``, while ``torch.export`` or
    ``torch.compile`` traces a program for every batch and length) stays symbolic: ``int()`` would
    fix it to the example's value, and the comparisons below record conditions on it instead."""
    return tuple(d if type(d).__name__ == "SymInt" else int(d) for d in shape)


def check_ids(name: str, shape: Sequence[int], dtype: str, is_integer: bool, max_len: int) -> None:
    """Token ids must be integers of shape ``(batch, seq)`` with ``1 <= seq <= max_len``."""
    shape = _sizes(shape)
    if len(shape) != 2:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got rank {len(shape)} "
                         f"shape {shape}")
    if not is_integer:
        raise TypeError(f"{name}: expected integer token ids, got dtype {dtype}")
    if shape[0] < 1 or shape[1] < 1:
        raise ValueError(empty_message(name, *shape))
    if shape[1] > max_len:
        raise ValueError(too_long_message(name, max_len, shape[1]))


def ragged_rows(value) -> list[int] | None:
    """The row lengths of a nested list or tuple whose rows differ in length (what no array can
    hold), else None."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in value):
        return None
    lengths = [len(r) for r in value]
    return lengths if len(set(lengths)) > 1 else None


def ragged_message(name: str, lengths: Sequence[int]) -> str:
    listed = ", ".join(map(str, lengths[:10])) + (", ..." if len(lengths) > 10 else "")
    return (f"{name}: expected token ids of shape (batch, seq), every row of one length, got rows of "
            f"lengths [{listed}]; pad the rows to one length (with pad_id)")


def is_object_array(value) -> bool:
    """A NumPy array of Python objects (dtype ``object``: None, mixed types), which no framework
    converts."""
    return getattr(getattr(value, "dtype", None), "kind", None) == "O"


def not_an_array_message(name: str, value) -> str:
    """What every implementation says of ``value`` when it holds no numbers to convert: None or
    another object (``got NoneType``), or a NumPy array of Python objects, named by its dtype (it
    is an array: "expected a tensor or array, got ndarray" contradicted itself)."""
    if is_object_array(value):
        return f"{name}: expected a tensor or array of numbers, got an ndarray of dtype object"
    return f"{name}: expected a tensor or array, got {type(value).__name__}"


def masked_entries(name: str, value) -> str | None:
    """What is wrong with a NumPy masked array that masks entries (``"name: a masked array with 2
    masked entries; ..."``), else None: a copy or a conversion keeps the values under the mask,
    which its owner said not to use, and would compute with them silently. Weights
    (`shared.weights.snapshot_weights`), ids, masks and a loss's arrays (`as_array`) refuse it."""
    if not isinstance(value, np.ma.MaskedArray) or not np.ma.getmaskarray(value).any():
        return None
    masked = int(np.ma.count_masked(value))
    return (f"{name}: a masked array with {masked:,} masked entr{'y' if masked == 1 else 'ies'}; fill them "
            "(.filled(value)) or pass .data")


def as_array(name: str, value) -> np.ndarray:
    """``value``, which is not a framework's tensor (a NumPy array, nested lists, a number), as
    NumPy reads it, or the one error all three implementations raise for what holds no numbers
    (or text, which the checks after name by its dtype): None or another object, an array of
    objects, or lists NumPy cannot make one array of (``TypeError``, `not_an_array_message`).
    Each backend converts its loss's and its batches' non-tensors here, so that none of them names
    a bad value in its framework's words. A masked array that masks entries is refused
    (``ValueError``, `masked_entries`)."""
    if (masked := masked_entries(name, value)) is not None:
        raise ValueError(masked)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as err:  # lists ragged below the rows, a sequence
        if hasattr(value, "dtype"):  # or another framework's tensor NumPy cannot read: its reason
            # (torch's bfloat16, a tensor on a GPU or one that requires grad, with torch's way out)
            raise TypeError(f"{name}: expected a tensor or array NumPy can read, got a "
                            f"{type(value).__name__} of dtype {str(value.dtype).rsplit('.', 1)[-1]} "
                            f"({err})") from None
        array = None
    if array is None or array.dtype.kind == "O":
        raise TypeError(not_an_array_message(name, value))
    return _canonical(array)


def _canonical(array: np.ndarray) -> np.ndarray:
    """A NumPy array of numbers in the native byte order, of NumPy's own name for its type, and
    no wider than 64 bits: torch converts neither a big-endian array nor one of ``np.ulonglong``
    (uint64 by another name, what NumPy 1 makes of ``uint64 + 2**63``), and neither framework
    holds a ``longdouble``, which becomes float64 (the reference computes in float64 anyway).
    Values are unchanged but a longdouble's extra bits; other arrays are returned as they are."""
    if array.dtype.kind not in "iuf":
        return array
    canonical = np.dtype(f"{array.dtype.kind}{min(array.dtype.itemsize, 8)}")
    if array.dtype.str != canonical.str:
        return array.astype(canonical)  # byte order or width: the values converted
    return array if array.dtype.type is canonical.type else array.view(canonical)


def ids_array(name: str, value) -> np.ndarray:
    """`as_array` of ids, ``(batch, seq)``: rows of different lengths are named as such first
    (``ValueError``, `ragged_message`: what to do about them, not NumPy's "inhomogeneous
    shape")."""
    if (lengths := ragged_rows(value)) is not None:
        raise ValueError(ragged_message(name, lengths))
    array = as_array(name, value)
    if array.size == 0 and array.dtype == np.float64 and not isinstance(value, np.ndarray):
        # NumPy's dtype for an empty list: no dtype was given, so the emptiness is named, not it
        array = array.astype(np.int64)
    return array


def batch_ids(name: str, value) -> np.ndarray:
    """A batch's ids (``src``, ``tgt`` or ``tgt_out``) that are not a framework's tensor, as a
    NumPy array of numbers (`ids_array`: ragged rows, None and objects refused), text
    refused here (shape first, then dtype, as `check_ids` orders them) because torch
    cannot hold it and TensorFlow would hold it until a later check. The backend converts the
    array and checks its values (its own `check_ids`); `shared.masks` reads its ids here too."""
    array = ids_array(name, value)
    if array.dtype.kind not in "biuf":  # text, or another kind no framework holds as ids
        check_ids(name, array.shape, dtype_name(array), False, max_len=2**62)
    return array


def dtype_name(array: np.ndarray) -> str:
    """A NumPy array's dtype as the checks name dtypes: as NumPy names it, but text ``string``,
    as TensorFlow names its text (NumPy's ``<U1`` would differ by length and byte order)."""
    return "string" if array.dtype.kind in "US" else str(array.dtype)


def array_kind(array: np.ndarray) -> tuple[str, bool, bool]:
    """A NumPy array's dtype as the checks name it (`dtype_name`), whether it holds integers (not
    bool) and whether floats: what each backend's loss checks of an array it has not converted."""
    return dtype_name(array), array.dtype.kind in "iu", array.dtype.kind == "f"


def checked_ids(name: str, value, vocab: int, max_len: int) -> np.ndarray:
    """``value`` as NumPy token ids ``(batch, seq)``, checked as every implementation checks its
    ids, with the same errors: `ids_array` (rows of different lengths, lists ragged below the rows,
    None and objects), then `check_ids` (rank, integer dtype, ``1 <= seq <= max_len``), then
    `check_ids_range` (``[0, vocab)``). The NumPy implementations' check (the reference, ONNX
    Runtime's `twins.onnx_runtime`); each framework's does the same on its tensors."""
    ids = ids_array(name, value)
    check_ids(name, ids.shape, dtype_name(ids), ids.dtype.kind in "iu", max_len)
    check_ids_range(name, vocab, int(ids.min()), int(ids.max()))
    return ids


def checked_mask(name: str, mask, config: TransformerConfig, batch: int, q_len: int, k_len: int) -> np.ndarray:
    """A given mask as a NumPy bool array (`mask_array`) that broadcasts to ``(batch, heads, q_len,
    k_len)`` (`check_mask`)."""
    mask = mask_array(name, mask)
    check_mask(name, mask.shape, "bool", True, batch, config.n_heads, q_len, k_len)
    return mask


def checked_inputs(config: TransformerConfig, src, tgt, src_mask=None, tgt_mask=None) -> tuple:
    """A forward pass's inputs as NumPy arrays, checked in the order and words of every
    implementation's model call: the ids (`checked_ids`), equal batches, then each mask given
    (``src_mask`` broadcastable to ``(B, H, 1, S)``, ``tgt_mask`` to ``(B, H, T, T)``; None stays
    None). Returns ``(src, tgt, src_mask, tgt_mask)``. The reference's check, and tf_impl's of a
    Keras batch made in Python, before a step compiled with XLA could take it."""
    src = checked_ids("src", src, config.src_vocab, config.max_len)
    tgt = checked_ids("tgt", tgt, config.tgt_vocab, config.max_len)
    check_same_batch(src.shape, tgt.shape)
    (b, s), t = src.shape, tgt.shape[1]
    if src_mask is not None:
        src_mask = checked_mask("src_mask", src_mask, config, b, 1, s)
    if tgt_mask is not None:
        tgt_mask = checked_mask("tgt_mask", tgt_mask, config, b, t, t)
    return src, tgt, src_mask, tgt_mask


def empty_message(name: str, batch, seq) -> str:
    return f"{name}: expected a non-empty (batch, seq), got shape ({batch}, {seq})"


def too_long_message(name: str, max_len: int, seq) -> str:
    return f"{name}: expected at most max_len={max_len} tokens, got {seq}"


def same_batch_message(name: str, batch, got, like: str = "src") -> str:
    return f"{name}: expected batch size {batch} (as {like}), got {got}"


def ids_range_message(name: str, vocab: int, lo: int, hi: int) -> str:
    return f"{name}: expected token ids in [0, {vocab}), got values in [{lo}, {hi}]"


def ids_range_assertion(name: str, vocab: int) -> str:
    """`ids_range_message` where the values cannot be shown: an assertion inside a traced program
    (``torch.export``, ``torch.compile``), which cannot format them when it fails."""
    return f"{name}: expected token ids in [0, {vocab}), got a value outside it"


def check_ids_range(name: str, vocab: int, lo: int, hi: int) -> None:
    """Ids out of range are rejected before any lookup (a gather would clamp or zero them silently)."""
    if lo < 0 or hi >= vocab:
        raise ValueError(ids_range_message(name, vocab, lo, hi))


def check_same_batch(src_shape: Sequence[int], tgt_shape: Sequence[int], name: str = "tgt") -> None:
    """The first size of ``tgt_shape`` is ``src_shape``'s; ``name``: the argument as its caller's
    user passed it (``tgt_in`` of a training batch)."""
    (batch,), (got,) = _sizes(src_shape[:1]), _sizes(tgt_shape[:1])
    if batch != got:
        raise ValueError(same_batch_message(name, batch, got))


def mask_expectation(batch, n_heads, q_len, k_len) -> str:
    """The expected mask shape as messages spell it (sizes may be ``"{}"`` placeholders: the TF
    backend fills them at run time, in the order q_len, k_len, batch, n_heads, q_len, k_len)."""
    return f"(batch|1, heads|1, {q_len}|1, {k_len}) = ({batch}|1, {n_heads}|1, {q_len}|1, {k_len})"


def mask_dtype_message(name: str, dtype: str) -> str:
    return f"{name}: expected a bool mask (True = may attend), got dtype {dtype}"


def mask_array(name: str, value) -> np.ndarray:
    """A mask that is not a framework's tensor, as NumPy reads it (anything with ``__array__``: an
    array, a NumPy bool, a CPU tensor), bool; else what every implementation says of it, before a
    framework converts it (none holds a duration, a date or text, and each would name them in its
    own words): no array at all (a list, a number), or not bool, named by its dtype (`check_mask`'s
    first check). The decoders of every implementation, the reference's forward pass and tf_impl's
    model call take masks so; torch_impl's model call takes torch tensors only."""
    if not hasattr(value, "__array__"):
        raise TypeError(f"{name}: expected a bool array or tensor (True = may attend), got {type(value).__name__}")
    if (masked := masked_entries(name, value)) is not None:
        raise ValueError(masked)
    array = np.asarray(value)
    if array.dtype != np.bool_:
        raise TypeError(mask_dtype_message(name, dtype_name(array)))
    return array


def check_mask(name: str, shape: Sequence[int], dtype: str, is_bool: bool,
               batch: int, n_heads: int, q_len: int, k_len: int) -> None:
    """A mask is bool, rank 4, and broadcasts to ``(batch, heads, q_len, k_len)`` with k_len exact.

    ``True`` means "may attend". Each leading dimension may be 1 (broadcast) or the full size.
    """
    shape = _sizes(shape)
    expected = mask_expectation(batch, n_heads, q_len, k_len)
    if not is_bool:
        raise TypeError(mask_dtype_message(name, dtype))
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a rank-4 mask broadcastable to {expected}, got shape {shape}")
    ok = (shape[0] in (1, batch) and shape[1] in (1, n_heads) and shape[2] in (1, q_len)
          and shape[3] == k_len)
    if not ok:
        raise ValueError(f"{name}: expected a mask broadcastable to {expected}, got shape {shape}")


def check_memory_shape(shape: Sequence, d_model: int) -> None:
    """The encoder memory given to ``decode`` or ``init_cache`` is ``(batch, src_len, d_model)``, as
    `encode` returns it, and holds a row and a position (``encode`` refuses an empty source; an
    empty cache would fail later in a framework's own words, or not at all). ``shape``: a
    framework's, ``None`` where unknown in a graph."""
    shape = tuple(d if d is None else _sizes([d])[0] for d in shape)
    if len(shape) != 3 or shape[2] != d_model:
        raise ValueError(f"memory: expected a tensor of shape (batch, src_len, {d_model}), got {shape}")
    if 0 in shape[:2]:
        raise ValueError(f"memory: expected a non-empty (batch, src_len, {d_model}), got shape {shape}")


def check_memory_dtype(dtype: str, expected: str) -> None:
    """The encoder memory given to ``decode`` or ``init_cache`` is in the dtype ``encode`` returns
    (the model's, whatever its precision: a half precision casts inside)."""
    if dtype != expected:
        raise TypeError(f"memory: expected dtype {expected}, got {dtype}")


def check_hidden(shape: Sequence, dtype: str, d_model: int, expected: str) -> None:
    """The hidden states given to a model's ``generator`` (its argument ``x``): ``(..., d_model)``
    (`decode`'s ``(B, T, d_model)``, a step's rows), in the dtype `decode` returns (the model's,
    whatever its precision: a half precision casts inside). A wrong width failed in each
    framework's words (a product's or a reshape's), a rank-2 input ran in one backend alone, and
    a float64 input was cast by Keras and refused by torch. ``shape``: a framework's, ``None``
    where unknown in a graph."""
    shape = tuple(d if d is None else _sizes([d])[0] for d in shape)
    if not shape or shape[-1] not in (d_model, None):
        raise ValueError(f"x: expected hidden states of shape (..., {d_model}), got {shape}")
    if dtype != expected:
        raise TypeError(f"x: expected dtype {expected}, got {dtype}")


def check_cache(n_layers: int, self_key: Sequence[int] | None, cross_key: Sequence[int] | None,
                dtype: str, vocab: int | None, *, layers: int, n_heads: int, d_k: int, max_len: int,
                expected_dtype: str, tgt_vocab: int) -> None:
    """A cache made by `init_cache` of a model like this one (``decode_step``'s ``cache``): its
    ``n_layers`` layers, their self- and cross-attention key buffers' shapes ``(N, H, C, d_k)`` and
    ``(B, H, S, d_k)`` (None without layers), its buffers' ``dtype`` and its generator's width
    ``vocab`` (None where the step calls the generator module) against the model's ``layers``,
    ``n_heads``, ``d_k``, ``max_len`` (C beyond it has no positional row), the dtype its step
    computes in and ``tgt_vocab``. A cache of another shape would fail inside the framework, or
    worse give logits of another vocabulary."""
    got = []
    if n_layers != layers:
        got.append(f"{n_layers} layer{'s' * (n_layers != 1)}")
    if self_key is not None and cross_key is not None:
        (_, heads, capacity, width), (_, cross_heads, _, cross_width) = _sizes(self_key), _sizes(cross_key)
        if (heads, width, cross_heads, cross_width) != (n_heads, d_k, n_heads, d_k):
            got.append(f"{heads} heads of {width} (cross-attention {cross_heads} of {cross_width})")
        if capacity > max_len:
            got.append(f"{capacity} positions")
        if dtype != expected_dtype:
            got.append(dtype)
    if vocab is not None and vocab != tgt_vocab:
        got.append(f"tgt_vocab={vocab}")
    if got:
        raise ValueError(f"cache: expected one of this model's init_cache ({layers} layers of {n_heads} "
                         f"heads of {d_k}, {expected_dtype}, at most max_len={max_len} positions, "
                         f"tgt_vocab={tgt_vocab}), got " + ", ".join(got))


def check_beam_rows(shape: Sequence[int] | None, dtype: str, is_integer: bool, rows: int | None) -> None:
    """A beam reorder's ``rows`` (`DecoderCache.reorder_beams`): one source row per cache row,
    integer indices. Shape ``(rows,)``; not checked where ``shape`` or ``rows`` is None (unknown
    while TensorFlow traces a graph)."""
    shape = None if shape is None else _sizes(shape)
    if shape is not None and rows is not None and shape != (rows,):
        raise ValueError(f"rows: expected a tensor of shape ({rows},) (one source row per cache row), "
                         f"got {shape}")
    if not is_integer:
        raise TypeError(f"rows: expected integer row indices, got dtype {dtype}")


def check_beam_rows_items(values: Sequence[int], beams: int) -> None:
    """Each row continues a row of its own item (``values[n] // beams == n // beams``): a cache
    keeps the source's keys once per item, not per beam, so a row taken from another item would
    attend the wrong source. ``values``: the rows, read to the host."""
    for n, row in enumerate(values):
        if not 0 <= row < len(values) or row // beams != n // beams:
            item = n // beams
            raise ValueError(f"rows: expected each row's source among its own item's beams (rows "
                             f"{item * beams} to {item * beams + beams - 1} for row {n}, {beams} beams "
                             f"an item), got rows[{n}] = {row}")
