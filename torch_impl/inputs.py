"""Input checks and default masks for the torch backend.

Every check goes through `shared.checks` with the tensor's metadata, so a bad input fails here with
the same type and message as in the NumPy reference and the TensorFlow backend. Ids are range-checked
before any embedding lookup: a gather on CPU raises an opaque IndexError and on CUDA a device-side
assert, neither of which names the argument.

Masks are boolean, ``True`` = may attend, broadcastable to ``(batch, heads, q_len, k_len)``.
"""
from __future__ import annotations

import numpy as np
import torch

from shared import checks
from shared.checks import batch_ids
from shared.masks import check_mask_ids, check_pad_id


def _from_array(array: np.ndarray) -> torch.Tensor:
    """A checked NumPy array (`shared.checks.as_array`'s: native, numbers) as a CPU tensor, as
    the other implementations take any array: its memory where torch can hold it, else a
    C-contiguous copy. torch holds no negative stride (``src[:, ::-1]`` failed in torch's words,
    "At least one stride in the given numpy array is negative") and warns of a read-only array
    (``np.broadcast_to``'s) that it may write to. torch's own need: TensorFlow converts such
    arrays as they are, so tf_impl has no such helper (private, out of the mirror rule)."""
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = np.array(array, order="C")
    return torch.from_numpy(array)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # "float32", as NumPy spells it in the reference


def _is_integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def check_ids(name: str, ids, vocab: int, max_len: int) -> None:
    """Token ids: an integer tensor of shape (batch, seq), 1 <= seq <= max_len, values in [0, vocab).

    Raises:
        TypeError: not a torch tensor, or not an integer dtype.
        ValueError: a ragged list, wrong rank, empty, longer than ``max_len``, or an id outside
            ``[0, vocab)``.
    """
    if (lengths := checks.ragged_rows(ids)) is not None:  # the reference's and tf_impl's message
        raise ValueError(checks.ragged_message(name, lengths))
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name}: expected a torch tensor of token ids, got {type(ids).__name__}")
    checks.check_ids(name, ids.shape, _dtype_name(ids.dtype), _is_integer(ids.dtype), max_len)
    if torch.compiler.is_compiling() and ids.device.type == "cpu":
        # torch.compile / torch.export: a program cannot branch on values, so the range check is
        # an assertion in it, which raises when the program runs. On the CPU only: on CUDA it
        # would be a device-side assert, which ends the process's CUDA context; there the check
        # stays eager (torch.compile breaks its graph here, as before).
        in_range = ((ids >= 0) & (ids < vocab)).all()
        torch._assert_async(in_range, checks.ids_range_assertion(name, vocab))
        return
    checks.check_ids_range(name, vocab, *_id_range(ids))


def _id_range(ids: torch.Tensor) -> tuple[int, int]:
    """The least and greatest id of a non-empty integer tensor, read to the host."""
    return _id_summary(ids)[:2]


def _id_summary(ids: torch.Tensor, pad_id: int | None = None) -> tuple[int, int, bool]:
    """`_id_range` and, with ``pad_id``, whether any id is not ``pad_id`` (the loss's "some
    target" check), all read to the host in one transfer; without it the flag is False."""
    if ids.dtype == torch.uint64:  # .long() would wrap an id >= 2**63 to a negative number
        values = ids.cpu().numpy()
        return int(values.min()), int(values.max()), pad_id is not None and bool((values != pad_id).any())
    # one device-to-host transfer for everything (the only sync on the hot path, a necessary one)
    wide = ids.long()
    parts = list(torch.aminmax(wide))
    if pad_id is not None:  # a pad_id past int64 equals no id
        parts.append((wide != pad_id).any().long() if -2**63 <= pad_id < 2**63 else torch.ones_like(parts[0]))
    values = torch.stack(parts).tolist()
    return values[0], values[1], pad_id is not None and bool(values[2])


def _as_ids(name: str, value, vocab: int, max_len: int, device: torch.device) -> torch.Tensor:
    """`check_ids` of ``value`` as a tensor on ``device``: tensors as they are, NumPy arrays and
    lists converted first (`shared.checks.batch_ids`), as tf_impl's training converts them."""
    ids = value if isinstance(value, torch.Tensor) else _from_array(batch_ids(name, value))
    check_ids(name, ids, vocab, max_len)
    return ids.to(device)


def check_mask(name: str, mask, batch: int, n_heads: int, q_len: int, k_len: int) -> None:
    """A bool tensor (True = may attend) broadcastable to ``(batch, n_heads, q_len, k_len)``,
    with the key axis exactly ``k_len``.

    Raises:
        TypeError: not a torch tensor, or not bool.
        ValueError: not rank 4, or a shape that does not broadcast.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a torch bool tensor, got {type(mask).__name__}")
    checks.check_mask(name, mask.shape, _dtype_name(mask.dtype), mask.dtype == torch.bool,
                      batch, n_heads, q_len, k_len)


def check_same_batch(src: torch.Tensor, tgt: torch.Tensor, name: str = "tgt") -> torch.Tensor:
    """``tgt`` (ids or memory) must have the batch size of ``src``, the error naming ``name``;
    returns ``tgt`` (the mirror of tf_impl's, which may have to check at run time; here every size
    is known)."""
    checks.check_same_batch(src.shape, tgt.shape, name)
    return tgt


def _check_mask_ids(name: str, ids) -> None:
    """The ids of a ``make_*_mask`` helper: a torch integer tensor of rank 2 (`check_ids`'s words
    for a ragged list or a non-tensor; `shared.masks.check_mask_ids` for the rest)."""
    if (lengths := checks.ragged_rows(ids)) is not None:
        raise ValueError(checks.ragged_message(name, lengths))
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name}: expected a torch tensor of token ids, got {type(ids).__name__}")
    check_mask_ids(name, ids.shape, _dtype_name(ids.dtype), _is_integer(ids.dtype))


def _not_pad(ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """``ids != pad_id`` as numbers, all True for a ``pad_id`` of None or one that no id of the
    dtype can equal: compared in the ids' own dtype, ``pad_id`` 300 wrapped to 44 in uint8 and hid
    token 44 (tf_impl's and the reference's masks compare as numbers)."""
    info = torch.iinfo(ids.dtype)
    if pad_id is None or not info.min <= pad_id <= info.max:
        return torch.ones_like(ids, dtype=torch.bool)
    return ids != pad_id


def make_src_mask(src: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Source mask ``(batch, 1, 1, src_len)``: True where the key token is not padding; all True
    when ``pad_id`` is None (``config.mask_padding=False``, `shared.masks.padding_id`).

    Raises:
        TypeError: ``pad_id`` neither an int nor None, or ``src`` no integer tensor (the reference's
            messages, before any work).
        ValueError: ``src`` not of rank 2."""
    check_pad_id(pad_id)
    _check_mask_ids("src", src)
    return _not_pad(src, pad_id)[:, None, None, :]


def make_tgt_mask(tgt: torch.Tensor, pad_id: int | None, first_is_real: bool = False) -> torch.Tensor:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: the key is not padding AND key <= query.

    ``first_is_real`` (`shared.masks.start_is_pad(config)`): column 0 is the decoder start token,
    never padding; padding comes from ``tgt != pad_id`` for positions 1.. only (`shared.masks`).
    ``pad_id=None`` (`shared.masks.padding_id`): no key is padding, the subsequent mask alone.

    Raises:
        TypeError: ``pad_id`` neither an int nor None, or ``tgt`` no integer tensor (the reference's
            messages, before any work).
        ValueError: ``tgt`` not of rank 2."""
    check_pad_id(pad_id)
    checks.check_flag(first_is_real, "first_is_real")  # "no" read for its truth made column 0 real
    _check_mask_ids("tgt", tgt)
    t = tgt.shape[1]
    subsequent = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
    keys = _not_pad(tgt, pad_id)  # (B, T)
    if first_is_real:
        keys = keys | (torch.arange(t, device=tgt.device) == 0)
    return keys[:, None, None, :] & subsequent  # (B, 1, T, T)
