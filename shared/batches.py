"""Token batches with chosen padding patterns, drawn deterministically (NumPy only).

The inputs every comparison runs on: the parity suite's cases, `twins compare` and `twins convert
--verify` all draw their batches here, so a figure in the command line and a test's are made on the
same kind of input."""
from __future__ import annotations

import numpy as np

from shared import TransformerConfig
from shared.config import INT64_MAX
from shared.checks import check_config, check_seed, is_int, refusal
from shared import memory
from shared.messages import shown


def _check_size(name: str, value) -> None:
    """A vocabulary, batch or length: an int >= 1 (the model refuses an empty batch anyway), one
    that int64 holds (a vocabulary: one whose ids it holds)."""
    if not is_int(value):
        raise TypeError(f"{name}: expected an int >= 1, got {shown(value)}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {shown(value, str)}")
    if name == "vocab" and value > 2**63:
        raise ValueError(f"vocab: expected at most 2**63 (the ids are int64), got {shown(value, str)}")
    if name != "vocab" and value > INT64_MAX:
        raise ValueError(f"{name}: expected an int <= 2**63 - 1 (int64), got {shown(value, str)}")


def _check_fits(names: str, batch: int, length: int) -> None:
    """A ``(batch, length)`` int64 array this machine's memory holds, refused by name before NumPy
    is asked for it (its own error says "Maximum allowed dimension exceeded" or "Unable to
    allocate"). Python ints: a product of NumPy ints could wrap around."""
    need = int(batch) * int(length) * 8
    limit = memory.exceeded(need)
    if limit is not None:
        raise ValueError(f"{names}: a ({shown(batch, str)}, {shown(length, str)}) array of int64 ids "
                         f"needs {need / 2**30:,.1f} GiB, more than this machine's "
                         f"{limit / 2**30:.1f} GiB")


def _check_lengths(name: str, lengths, batch: int, length: int) -> None:
    """One real-token count per row, each in [0, length]: a negative one would pad from the end
    (``ids[b, -1:]``), a short list leave rows unpadded, a long one index past the batch."""
    expected = f"one int in [0, {length}] per row, {batch} in all"
    if not isinstance(lengths, (list, tuple, np.ndarray)):
        raise TypeError(f"{name}: expected {expected}, got {type(lengths).__name__}")
    if len(lengths) != batch:
        raise ValueError(f"{name}: expected {expected}, got {len(lengths)}")
    for b, n in enumerate(lengths):
        if not is_int(n) or not 0 <= n <= length:
            raise refusal(is_int(n))(f"{name}: expected {expected}, got {name}[{b}] = {shown(n)}")


def token_batch(config: TransformerConfig, vocab: int, batch: int, length: int, seed: int = 0,
                lengths: list[int] | None = None) -> np.ndarray:
    """Ids (batch, length), int64, no special ids inside; row b keeps ``lengths[b]`` real tokens
    followed by padding (default: the first row full, the others progressively shorter, at least 1).
    A length of 0 gives an all-padding row. A bad argument is refused, named, before anything is
    drawn: ``TypeError`` for one of the wrong type, ``ValueError`` for one out of range."""
    check_config(config)
    for name, value in (("vocab", vocab), ("batch", batch), ("length", length)):
        _check_size(name, value)
    _check_fits("batch, length", batch, length)
    check_seed(seed)
    if lengths is not None:
        _check_lengths("lengths", lengths, batch, length)
    rng = np.random.default_rng(seed)
    # Ids are drawn from [0, vocab) less the special ids; a vocabulary of special ids only (2 or 3
    # entries) draws from its non-pad ids, one of 1 entry from that entry: every id drawn lies in
    # [0, vocab), as the model's check demands.
    for skip in ({config.pad_id, config.bos_id, config.eos_id}, {config.pad_id}, set()):
        skipped = sorted(i for i in skip if 0 <= i < vocab)
        if len(skipped) < vocab:
            break
    # The k-th id not skipped, found by stepping past each skipped id at or below it (in order),
    # rather than from a list of the ids: a vocabulary of 10**9 would be a list of 10**9. Draws
    # what `rng.choice` on that list drew.
    ids = rng.integers(0, vocab - len(skipped), size=(batch, length), dtype=np.int64)
    for i in skipped:
        ids += ids >= i
    if lengths is None:
        lengths = [max(1, length - (length * b) // (batch + 1)) for b in range(batch)]
    for b, n in enumerate(lengths):
        ids[b, n:] = config.pad_id
    return ids


def src_tgt(config: TransformerConfig, batch: int = 2, src_len: int = 7, tgt_len: int = 5,
            seed: int = 0, src_lengths=None, tgt_lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """A source batch and a target-input batch (the start token ``config.start_id`` first, then
    tokens, then padding; a row of length 0 is all padding unless the start token is pad)."""
    # checked here, under this function's own argument names (token_batch's are batch, length,
    # lengths); the target is drawn with seed + 1
    check_config(config)
    for name, value in (("batch", batch), ("src_len", src_len), ("tgt_len", tgt_len)):
        _check_size(name, value)
    _check_fits("batch, src_len", batch, src_len)
    _check_fits("batch, tgt_len", batch, tgt_len)
    check_seed(seed)
    for name, given, length in (("src_lengths", src_lengths, src_len), ("tgt_lengths", tgt_lengths, tgt_len)):
        if given is not None:
            _check_lengths(name, given, batch, length)
    src = token_batch(config, config.src_vocab, batch, src_len, seed, src_lengths)
    tgt = token_batch(config, config.tgt_vocab, batch, tgt_len, int(seed) + 1, tgt_lengths)
    tgt[:, 0] = np.where(tgt[:, 0] == config.pad_id, tgt[:, 0], config.start_id)
    return src, tgt
