"""Where two decodings of the same sources part: the report `twins compare --decode` and the decoding
parity tests print (NumPy only).

Two implementations of one search can choose different tokens only where the step log-probs of
the two candidates are closer than their rounding: the float64 margin between them tells a
near-tie (inside the decode margin of the arithmetic that ran, `decode_margin`) from a real
disagreement.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from . import reference
from .checks import as_array, check_ids_range, dtype_name, ids_array
from .conditioning import largest
from .config import TransformerConfig
from .loss import log_softmax
from .tolerances import bound_for


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
        log_probs: optional ``(B, T, V)`` float step log-probs along ``tokens_a`` (e.g. the
            oracle's teacher-forced log-softmax); gives each divergence its margin, and then every
            token must be in ``[0, V)``.

    Raises ``TypeError`` / ``ValueError`` naming the argument: tokens that are not integer ids of
    one ``(B, T)`` shape, ``log_probs`` of another shape or not floating, a token outside its
    vocabulary (-1, a refused row's, read the last id's log-prob).
    """
    a, b = ids_array("tokens_a", tokens_a), ids_array("tokens_b", tokens_b)
    if a.ndim != 2:
        raise ValueError(f"tokens_a: expected token ids of shape (batch, steps), got shape {a.shape}")
    if b.shape != a.shape:
        raise ValueError(f"tokens_b: expected the shape of tokens_a, {a.shape}, got {b.shape}")
    for name, tokens in (("tokens_a", a), ("tokens_b", b)):
        if tokens.dtype.kind not in "iu":  # a float token would be truncated to another id
            raise TypeError(f"{name}: expected integer token ids, got dtype {dtype_name(tokens)}")
    if log_probs is not None:
        log_probs = as_array("log_probs", log_probs)
        if log_probs.ndim != 3 or log_probs.shape[:2] != a.shape or log_probs.dtype.kind != "f":
            raise ValueError(f"log_probs: expected float step log-probs of shape ({a.shape[0]}, {a.shape[1]}, "
                             f"vocab) along tokens_a, got shape {log_probs.shape} dtype {dtype_name(log_probs)}")
        for name, tokens in (("tokens_a", a), ("tokens_b", b)):  # -1 (a refused row) read the last id's
            if tokens.size:
                check_ids_range(name, log_probs.shape[2], int(tokens.min()), int(tokens.max()))
    out = []
    for item in np.flatnonzero((a != b).any(axis=1)):
        step = int(np.argmax(a[item] != b[item]))
        tok_a, tok_b = int(a[item, step]), int(b[item, step])
        margin = np.nan
        if log_probs is not None:
            row = log_probs[item, step]
            margin = float(row[tok_a] - row[tok_b])
        out.append(Divergence(int(item), step, tok_a, tok_b, margin))
    return out


def _teacher_forced(config: TransformerConfig, tokens: np.ndarray) -> np.ndarray:
    """The decoder input that reproduces the decoded ``tokens`` ``(B, T)`` step by step: the start
    token, then each token but the last. After EOS any non-pad id will do as an input (its steps
    are not read), so a pad there is fed as EOS; column 0 is the start token, which may be pad."""
    inputs = np.where(tokens[:, :-1] == config.pad_id, config.eos_id, tokens[:, :-1])
    return np.concatenate([np.full((tokens.shape[0], 1), config.start_id), inputs], axis=1)


def oracle_log_probs(weights: Mapping[str, np.ndarray], config: TransformerConfig, src: np.ndarray,
                     tokens: np.ndarray) -> np.ndarray:
    """The float64 oracle's step log-probs ``(B, T, V)`` along its own decoded ``tokens`` ``(B, T)``
    of ``src`` (teacher forcing): the ``log_probs`` that give `first_divergence` its margins when
    ``tokens_a`` is the oracle's."""
    return log_softmax(reference.forward(weights, config, src, _teacher_forced(config, tokens)))


def decode_margin(precision: str, weights: Mapping[str, np.ndarray], config: TransformerConfig,
                  src: np.ndarray, tokens: np.ndarray) -> float:
    """The log-prob margin within which ``precision``'s arithmetic may choose either of two
    candidates, along the oracle's decoded ``tokens`` ``(B, T)`` of ``src``: the ``decode-margin``
    bound of ``precision`` (`shared.tolerances`) `~shared.tolerances.Bound.conditioned` by the
    oracle's pass along them (`shared.conditioning.largest`), times the scale of that pass's logits,
    ``max(max|z|, 1)``, as every bound is taken on its tensor's scale: a gap between two
    candidates' log-probs is a gap between their logits, whose rounding is relative to their size
    (a bfloat16 logit near 20 is a multiple of 2**-3)."""
    logits, trace = reference.forward(weights, config, src, _teacher_forced(config, tokens), return_trace=True)
    margin = bound_for(precision, "decode-margin").conditioned(*largest(config, weights, trace))
    return margin.rtol * margin.scale(logits)
