"""Where two decodings of the same sources part: the report `twins compare --decode` and the decoding
parity tests print (NumPy only).

Two implementations of one search can choose different tokens only where the step log-probs of
the two candidates are closer than their rounding: the float64 margin between them tells a
near-tie (inside the float32 bound of `shared.tolerances`) from a real disagreement.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Divergence(NamedTuple):
    """Where two decodings of one item first differ: at ``step`` one chose ``token_a``, the other
    ``token_b``; ``margin`` is ``token_a``'s log-prob minus ``token_b``'s in the step log-probs
    given to `first_divergence` (NaN when none were given). A margin within the float32 error of
    the log-probs means a near-tie, not a bug."""
    item: int
    step: int
    token_a: int
    token_b: int
    margin: float

    def __str__(self) -> str:
        return (f"item {self.item}: first differs at step {self.step}: token {self.token_a} vs "
                f"{self.token_b}, margin {self.margin:.3g}")


def first_divergence(tokens_a, tokens_b, log_probs=None) -> list[Divergence]:
    """One `Divergence` per item whose decoded tokens differ, in item order (empty when all agree).

    Args:
        tokens_a, tokens_b: ``(B, T)`` token ids of two decodings of the same sources (e.g. the
            float64 oracle and a float32 backend).
        log_probs: optional ``(B, T, V)`` step log-probs along ``tokens_a`` (e.g. the oracle's
            teacher-forced log-softmax); gives each divergence its margin.
    """
    a, b = np.asarray(tokens_a), np.asarray(tokens_b)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"tokens: expected two (batch, steps) arrays of one shape, got {a.shape} "
                         f"and {b.shape}")
    out = []
    for item in np.flatnonzero((a != b).any(axis=1)):
        step = int(np.argmax(a[item] != b[item]))
        tok_a, tok_b = int(a[item, step]), int(b[item, step])
        margin = np.nan
        if log_probs is not None:
            row = np.asarray(log_probs)[item, step]
            margin = float(row[tok_a] - row[tok_b])
        out.append(Divergence(int(item), step, tok_a, tok_b, margin))
    return out
