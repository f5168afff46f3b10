"""Greedy decoding and beam search over a step function in torch: `shared.decoding`, step for step.

The module docstring of `shared.decoding` is the specification; this is its translation to torch,
on the device of the step's output and in its dtype, with the same names for the same state. The
loops know nothing of the network: `torch_impl.decoding` drives them with the model (cached or
recomputing), tests with fixed tables.

A step is ``step(prefixes: int64 (N, t+1)) -> log_probs (N, V)``, BOS in column 0, rows
``n = item * beams + beam``. A step that keeps state per row (a key/value cache) also passes
``reorder(rows)``: after each beam selection, row ``n`` continues from row ``rows[n]`` ``(N,)``.

Ties are broken explicitly (DESIGN convention 11): greedy takes the lowest id among the maxima, not
``torch.argmax``, whose tie order is not promised; beam search keeps the first K of
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

from shared.decoding import (BeamResult, GreedyResult, _check_batch, _check_ids, check_beam_size,
                             check_length_penalty, check_max_len)

Step = Callable[[torch.Tensor], torch.Tensor]
Reorder = Callable[[torch.Tensor], object]
Observe = Callable[[int, torch.Tensor], object]


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


class _StepCaller:
    """Runs ``step`` and checks its output as `shared.decoding._call_step` does: ``(N, V)``, V fixed,
    no NaN or +inf in live rows (that last check is deferred to `finish`, to share one sync)."""

    def __init__(self, step: Step, rows: int, ids: tuple[int, int, int], beam_size: int | None):
        self.step, self.rows, self.ids, self.beam_size = step, rows, ids, beam_size
        self.vocab: int | None = None

    def __call__(self, prefixes: torch.Tensor) -> torch.Tensor:
        out = self.step(prefixes)
        n, vocab = self.rows, self.vocab
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else np.shape(out)
        wrong_vocab = len(shape) == 2 and (shape[1] < 2 or (vocab is not None and shape[1] != vocab))
        if not isinstance(out, torch.Tensor) or len(shape) != 2 or shape[0] != n or wrong_vocab:
            want = f"({n}, {vocab})" if vocab is not None else f"({n}, vocab >= 2)"
            raise ValueError(f"step: expected log-probs of shape {want}, got shape {shape}")
        if vocab is None:
            self.vocab = shape[1]
            _check_ids(self.vocab, *self.ids)
            if self.beam_size is not None:
                check_beam_size(self.beam_size, self.vocab)
        return out

    @staticmethod
    def invalid(out: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """0-d bool: a live row holds NaN or +inf."""
        return ((torch.isnan(out) | torch.isposinf(out)) & live[:, None]).any()

    @staticmethod
    def finish(invalid: torch.Tensor, finished: torch.Tensor, t: int) -> bool:
        """One device sync per step: raise on a bad step output, else say whether all rows finished."""
        bad, done = torch.stack([invalid, finished.all()]).tolist()
        if bad:
            raise ValueError(f"step: expected log-probs without NaN or +inf (step {t})")
        return bool(done)


def _frozen_row(vocab: int, pad_id: int, like: torch.Tensor) -> torch.Tensor:
    """The log-probs a finished row proposes: pad at +0, everything else impossible. ``(V,)``."""
    row = torch.full((vocab,), float("-inf"), dtype=like.dtype, device=like.device)
    row[pad_id] = 0.0
    return row


def _argmax_lowest(x: torch.Tensor) -> torch.Tensor:
    """Index of the maximum along the last axis, the lowest index among equal maxima (explicit)."""
    ids = torch.arange(x.shape[-1], device=x.device)
    best = x.max(dim=-1, keepdim=True).values
    # A NaN row matches nothing; clamped so that the gathers stay in range until the deferred
    # NaN check (`_StepCaller.finish`) raises.
    return torch.where(x == best, ids, x.shape[-1]).min(dim=-1).values.clamp_max(x.shape[-1] - 1)


def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                  device: torch.device | str = "cpu", observe: Observe | None = None) -> GreedyResult:
    """Greedy decoding over ``step``; the algorithm of `shared.decoding.greedy_search`.

    Returns NumPy arrays: tokens ``(B, T)`` int64, log_probs ``(B, T)`` in the step's dtype,
    lengths ``(B,)`` int64 (T = max_len columns whatever step the loop stops at).
    """
    _check_batch(batch)
    check_max_len(max_len)
    prefixes = torch.full((batch, max_len + 1), pad_id, dtype=torch.int64, device=device)  # (B, 1+T)
    prefixes[:, 0] = bos_id
    lengths = torch.zeros(batch, dtype=torch.int64, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    call = _StepCaller(step, batch, (bos_id, eos_id, pad_id), None)
    log_probs = frozen = rows = None
    for t in range(max_len):
        out = call(prefixes[:, : t + 1])  # (B, V)
        if log_probs is None:
            log_probs = torch.zeros(batch, max_len, dtype=out.dtype, device=device)
            frozen, rows = _frozen_row(call.vocab, pad_id, out), torch.arange(batch, device=device)
        invalid = call.invalid(out, ~finished)
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
        if call.finish(invalid, finished, t):
            break
    return GreedyResult(_numpy(prefixes[:, 1:]), _numpy(log_probs), _numpy(lengths))


def beam_search(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
                pad_id: int, length_penalty: float = 0.0, return_all: bool = False,
                reorder: Reorder | None = None, device: torch.device | str = "cpu",
                observe: Observe | None = None) -> BeamResult:
    """Beam search over ``step`` (rows ``item * beam_size + beam``); the algorithm of
    `shared.decoding.beam_search`, in the step's dtype. ``reorder(rows (B*K,))`` is called after
    every selection when given. Returns NumPy arrays, shapes as `shared.decoding.BeamResult`.
    """
    _check_batch(batch)
    check_max_len(max_len)
    check_beam_size(beam_size)
    check_length_penalty(length_penalty)
    alpha = float(length_penalty)
    b_, k_ = batch, beam_size
    items = torch.arange(b_, device=device)[:, None]  # (B, 1), for gathers
    prefixes = torch.full((b_, k_, max_len + 1), pad_id, dtype=torch.int64, device=device)  # (B, K, 1+T)
    prefixes[..., 0] = bos_id
    lengths = torch.zeros(b_, k_, dtype=torch.int64, device=device)
    finished = torch.zeros(b_, k_, dtype=torch.bool, device=device)
    call = _StepCaller(step, b_ * k_, (bos_id, eos_id, pad_id), beam_size)
    raw = rank = step_scores = frozen = None
    for t in range(max_len):
        flat_prefixes = prefixes[..., : t + 1].reshape(b_ * k_, t + 1)  # (B*K, t+1)
        out = call(flat_prefixes)  # (B*K, V)
        vocab = call.vocab
        if raw is None:
            raw = torch.full((b_, k_), float("-inf"), dtype=out.dtype, device=device)
            raw[:, 0] = 0.0  # one live beam: the first step has no duplicates
            rank = raw.clone()
            step_scores = torch.zeros(b_, k_, max_len, dtype=out.dtype, device=device)
            frozen = _frozen_row(vocab, pad_id, out)
        invalid = call.invalid(out, ~finished.reshape(-1))
        lp = out.reshape(b_, k_, vocab).clone()  # (B, K, V)
        lp[..., pad_id] = float("-inf")
        lp = torch.where(finished[..., None], frozen, lp)  # a finished beam proposes only itself + pad
        cand_raw = raw[..., None] + lp  # (B, K, V)
        cand_len = lengths + (~finished).long()  # (B, K)
        if alpha == 0.0:  # penalty exactly 1.0: the ranking is the raw score
            cand_rank = cand_raw
        else:  # GNMT ((5 + L) / 6) ** alpha, in that order, in the score dtype
            cand_rank = cand_raw / (((5.0 + cand_len.to(out.dtype)) / 6.0) ** alpha)[..., None]
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
        if reorder is not None:
            reorder((items * k_ + src_beam).reshape(-1))  # (B*K,) source row of each new row
        if observe is not None:
            observe(t, top[:, : k_ + 1])
        if call.finish(invalid, finished, t):
            break
    best = _argmax_lowest(rank)  # always 0: the beams are kept in ranking order
    pick = (torch.arange(b_, device=device), best)
    result = BeamResult(_numpy(prefixes[pick][:, 1:]), _numpy(rank[pick]), _numpy(step_scores[pick]),
                        _numpy(lengths[pick]))
    if return_all:
        result = result._replace(all_tokens=_numpy(prefixes[..., 1:]), all_scores=_numpy(rank),
                                 all_lengths=_numpy(lengths))
    return result
