"""Greedy decoding and beam search over a step in torch: `shared.decoding`, step for step.

The module docstring of `shared.decoding` is the specification, its `Step` the contract; this is
its translation to torch, on ``device`` and in ``step.dtype``, with the same names for the same
state as the other translation, tf_impl.search. The loops know nothing of the network:
`torch_impl.decoding` drives them with the model (cached or recomputing), tests with fixed tables.

A step (`shared.decoding.Step`) declares ``vocab`` and ``dtype`` (they size the state before the
first step), gives ``initial_state()``, maps ``(prefixes, t, state)`` to ``(log_probs (N, V),
state)`` and ``reorder(state, rows)`` to the state after a beam selection. ``prefixes`` is the
whole buffer ``(N, 1 + T)`` int64 on ``device`` (BOS in column 0, the tokens chosen so far in
columns ``1 .. t``, pad after), ``t`` the step as a Python int; rows are ``n = item * beams +
beam``, and after a selection row ``n`` continues from row ``rows[n]`` ``(N,)``. A torch state may
be changed in place (the key/value cache is), as long as the step returns it.

As in tf_impl.search, each search is a loop (`greedy_loop`, `beam_loop`: tensors in, a dict of
tensors out), a conversion (`greedy_result`, `beam_result`: NumPy results) and the two together
behind the spec's argument checks (`greedy_search`, `beam_search`). What differs is what each
framework can do inside its loop: here a bad step output (NaN or +inf in a live row) raises the
spec's ``ValueError`` from within the loop, at the one device sync a step makes (which also reads
whether every row has finished), where TF records it in its loop state and raises afterwards.

Ties are broken explicitly (docs/design.md, convention 11): greedy takes the lowest id among the
maxima, not ``torch.argmax``, whose tie order is not promised; beam search keeps the first K of
``torch.sort(descending=True, stable=True)`` over the flat index ``beam * V + token``.

``observe(t, top)``, when given, is called after every step with the best scores of that step,
sorted descending: ``(B, 2)`` log-probs in greedy (top-two margins), ``(B, K + 1)`` candidate
ranking scores in beam search (the K kept and the best one dropped). Tests and benchmarks use it
to measure margins and per-step time; it changes nothing in the search.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from shared.decoding import BeamResult, GreedyResult, Step, check_beam_args, check_greedy_args

Observe = Callable[[int, torch.Tensor], object]


# -- helpers --------------------------------------------------------------------------------------
def _call_step(step: Step, prefixes: torch.Tensor, t: int, state, rows: int):
    """Run ``step``; its output must be a ``(rows, V)`` tensor in ``step.dtype``."""
    out, state = step(prefixes, t, state)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else np.shape(out)
    if not isinstance(out, torch.Tensor) or shape != (rows, step.vocab):
        raise ValueError(f"step: expected log-probs of shape ({rows}, {step.vocab}), got shape {shape}")
    if out.dtype != step.dtype:
        raise TypeError(f"step: expected log-probs of dtype {str(step.dtype)[6:]}, "
                        f"got {str(out.dtype)[6:]}")
    return out, state


def _invalid(out: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """0-d bool: a live row holds NaN or +inf (read at the step's one sync, `_finished`)."""
    return ((torch.isnan(out) | torch.isposinf(out)) & live[:, None]).any()


def _finished(invalid: torch.Tensor, finished: torch.Tensor, t: int) -> bool:
    """One device sync per step: raise on a bad step output, else say whether all rows finished."""
    bad, done = torch.stack([invalid, finished.all()]).tolist()
    if bad:
        raise ValueError(f"step: expected log-probs without NaN or +inf (step {t})")
    return bool(done)


def _frozen_row(vocab: int, pad_id: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The log-probs a finished row proposes: pad at +0, everything else impossible. ``(V,)``."""
    row = torch.full((vocab,), float("-inf"), dtype=dtype, device=device)
    row[pad_id] = 0.0
    return row


def _argmax_lowest(x: torch.Tensor) -> torch.Tensor:
    """Index of the maximum along the last axis, the lowest index among equal maxima (explicit)."""
    ids = torch.arange(x.shape[-1], device=x.device)
    best = x.max(dim=-1, keepdim=True).values
    # A NaN row matches nothing; clamped so that the gathers stay in range until the NaN check
    # (`_finished`) raises.
    return torch.where(x == best, ids, x.shape[-1]).min(dim=-1).values.clamp_max(x.shape[-1] - 1)


def _numpy(outputs: dict) -> dict:
    return {name: value.detach().cpu().numpy() for name, value in outputs.items()}


# -- greedy ---------------------------------------------------------------------------------------
def greedy_loop(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                device: torch.device | str = "cpu",
                observe: Observe | None = None) -> dict[str, torch.Tensor]:
    """The greedy loop of `shared.decoding.greedy_search` on tensors (no argument checks: see
    `greedy_search`). Returns tensors ``tokens (B, T)`` int64, ``log_probs (B, T)`` in
    ``step.dtype``, ``lengths (B,)`` int64 (T = max_len columns whatever step the loop stops at)."""
    dtype, vocab = step.dtype, step.vocab
    frozen = _frozen_row(vocab, pad_id, dtype, device)
    rows = torch.arange(batch, device=device)
    prefixes = torch.full((batch, max_len + 1), pad_id, dtype=torch.int64, device=device)  # (B, 1+T)
    prefixes[:, 0] = bos_id
    log_probs = torch.zeros(batch, max_len, dtype=dtype, device=device)
    lengths = torch.zeros(batch, dtype=torch.int64, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    state = step.initial_state()
    for t in range(max_len):
        out, state = _call_step(step, prefixes, t, state, batch)  # (B, V)
        invalid = _invalid(out, ~finished)
        lp = out.clone()
        lp[:, pad_id] = float("-inf")
        lp = torch.where(finished[:, None], frozen, lp)  # a finished row can only take pad, at +0
        tok = _argmax_lowest(lp)  # (B,)
        log_probs[:, t] = lp[rows, tok]
        prefixes[:, t + 1] = tok
        lengths += (~finished).long()
        finished |= tok == eos_id
        if observe is not None:
            observe(t, lp.topk(2, dim=-1).values)
        if _finished(invalid, finished, t):
            break
    return {"tokens": prefixes[:, 1:], "log_probs": log_probs, "lengths": lengths}


def greedy_result(outputs: dict) -> GreedyResult:
    """`greedy_loop`'s tensors as the NumPy `GreedyResult`."""
    out = _numpy(outputs)
    return GreedyResult(out["tokens"], out["log_probs"], out["lengths"])


def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                  device: torch.device | str = "cpu", observe: Observe | None = None) -> GreedyResult:
    """Greedy decoding over ``step``; the algorithm of `shared.decoding.greedy_search`, with its
    argument checks (`shared.decoding.check_greedy_args`), on ``device``.

    Returns NumPy arrays: tokens ``(B, T)`` int64, log_probs ``(B, T)`` in the step's dtype,
    lengths ``(B,)`` int64 (T = max_len columns whatever step the loop stops at).
    """
    check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)
    return greedy_result(greedy_loop(step, batch, max_len, bos_id, eos_id, pad_id, device, observe))


# -- beam search ----------------------------------------------------------------------------------
def beam_loop(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
              pad_id: int, length_penalty: float = 0.0, device: torch.device | str = "cpu",
              observe: Observe | None = None) -> dict[str, torch.Tensor]:
    """The beam loop of `shared.decoding.beam_search` on tensors (no argument checks: see
    `beam_search`). Returns the tensors of every `BeamResult` field (``all_*`` included)."""
    dtype, vocab = step.dtype, step.vocab
    b_, k_ = batch, beam_size
    alpha = float(length_penalty)
    frozen = _frozen_row(vocab, pad_id, dtype, device)
    items = torch.arange(b_, device=device)[:, None]  # (B, 1), for gathers
    prefixes = torch.full((b_, k_, max_len + 1), pad_id, dtype=torch.int64, device=device)  # (B, K, 1+T)
    prefixes[..., 0] = bos_id
    raw = torch.full((b_, k_), float("-inf"), dtype=dtype, device=device)
    raw[:, 0] = 0.0  # one live beam: the first step has no duplicates
    rank = raw.clone()
    lengths = torch.zeros(b_, k_, dtype=torch.int64, device=device)
    finished = torch.zeros(b_, k_, dtype=torch.bool, device=device)
    step_scores = torch.zeros(b_, k_, max_len, dtype=dtype, device=device)
    state = step.initial_state()
    for t in range(max_len):
        flat_prefixes = prefixes.view(b_ * k_, max_len + 1)  # (B*K, 1+T)
        out, state = _call_step(step, flat_prefixes, t, state, b_ * k_)  # (B*K, V)
        invalid = _invalid(out, ~finished.reshape(-1))
        lp = out.reshape(b_, k_, vocab).clone()  # (B, K, V)
        lp[..., pad_id] = float("-inf")
        lp = torch.where(finished[..., None], frozen, lp)  # a finished beam proposes only itself + pad
        cand_raw = raw[..., None] + lp  # (B, K, V)
        cand_len = lengths + (~finished).long()  # (B, K)
        if alpha == 0.0:  # penalty exactly 1.0: the ranking is the raw score
            cand_rank = cand_raw
        else:  # GNMT ((5 + L) / 6) ** alpha, in that order, in the score dtype
            cand_rank = cand_raw / (((5.0 + cand_len.to(dtype)) / 6.0) ** alpha)[..., None]
        top, order = torch.sort(cand_rank.reshape(b_, k_ * vocab), dim=-1, descending=True, stable=True)
        order = order[:, :k_]  # (B, K), flat beam * V + token
        src_beam, tok = order // vocab, order % vocab
        prefixes = prefixes[items, src_beam]
        prefixes[..., t + 1] = tok
        step_scores = step_scores[items, src_beam]
        step_scores[..., t] = lp[items, src_beam, tok]
        lengths = cand_len[items, src_beam]
        finished = finished[items, src_beam] | (tok == eos_id)
        raw = cand_raw[items, src_beam, tok]
        rank = cand_rank[items, src_beam, tok]
        state = step.reorder(state, (items * k_ + src_beam).reshape(-1))  # (B*K,) source rows
        if observe is not None:
            observe(t, top[:, : k_ + 1])
        if _finished(invalid, finished, t):
            break
    best = _argmax_lowest(rank)  # always 0: the beams are kept in ranking order
    pick = (torch.arange(b_, device=device), best)
    tokens = prefixes[..., 1:]
    return {"tokens": tokens[pick], "scores": rank[pick], "step_scores": step_scores[pick],
            "lengths": lengths[pick], "all_tokens": tokens, "all_scores": rank, "all_lengths": lengths}


def beam_result(outputs: dict, return_all: bool) -> BeamResult:
    """`beam_loop`'s tensors as the NumPy `BeamResult`."""
    out = _numpy(outputs)
    result = BeamResult(out["tokens"], out["scores"], out["step_scores"], out["lengths"])
    if return_all:
        result = result._replace(all_tokens=out["all_tokens"], all_scores=out["all_scores"],
                                 all_lengths=out["all_lengths"])
    return result


def beam_search(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
                pad_id: int, length_penalty: float = 0.0, return_all: bool = False,
                device: torch.device | str = "cpu", observe: Observe | None = None) -> BeamResult:
    """Beam search over ``step`` (rows ``item * beam_size + beam``); the algorithm of
    `shared.decoding.beam_search`, in the step's dtype, with its argument checks
    (`shared.decoding.check_beam_args`), on ``device``. Returns NumPy arrays, shapes as
    `shared.decoding.BeamResult`.
    """
    check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id, length_penalty)
    return beam_result(beam_loop(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                 length_penalty, device, observe), return_all)
