"""Token batches with chosen padding patterns, drawn deterministically (NumPy only).

The inputs every comparison runs on: the parity suite's cases, `twins compare` and `twins convert
--verify` all draw their batches here, so a figure in the command line and a test's are made on the
same kind of input."""
from __future__ import annotations

import numpy as np

from shared import TransformerConfig


def token_batch(config: TransformerConfig, vocab: int, batch: int, length: int, seed: int = 0,
                lengths: list[int] | None = None) -> np.ndarray:
    """Ids (batch, length), int64, no special ids inside; row b keeps ``lengths[b]`` real tokens
    followed by padding (default: the first row full, the others progressively shorter, at least 1).
    A length of 0 gives an all-padding row."""
    rng = np.random.default_rng(seed)
    specials = {config.pad_id, config.bos_id, config.eos_id}
    # a vocabulary of special ids only (2 or 3 entries) draws from its non-pad ids, one of 1 entry
    # from that entry: every id drawn lies in [0, vocab), as the model's check demands
    ordinary = np.array([i for i in range(vocab) if i not in specials]
                        or [i for i in range(vocab) if i != config.pad_id] or list(range(vocab)))
    ids = rng.choice(ordinary, size=(batch, length)).astype(np.int64)
    if lengths is None:
        lengths = [max(1, length - (length * b) // (batch + 1)) for b in range(batch)]
    for b, n in enumerate(lengths):
        ids[b, n:] = config.pad_id
    return ids


def src_tgt(config: TransformerConfig, batch: int = 2, src_len: int = 7, tgt_len: int = 5,
            seed: int = 0, src_lengths=None, tgt_lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """A source batch and a target-input batch (the start token ``config.start_id`` first, then
    tokens, then padding; a row of length 0 is all padding unless the start token is pad)."""
    src = token_batch(config, config.src_vocab, batch, src_len, seed, src_lengths)
    tgt = token_batch(config, config.tgt_vocab, batch, tgt_len, seed + 1, tgt_lengths)
    tgt[:, 0] = np.where(tgt[:, 0] == config.pad_id, tgt[:, 0], config.start_id)
    return src, tgt
