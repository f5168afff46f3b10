"""Greedy decoding and beam search over a step in torch: `shared.decoding`, step for step.

The module docstring of `shared.decoding` is the specification, its `Step` the contract; this is
its translation to torch, on ``device`` and in ``step.dtype``, with the same names for the same
state as the other translation, tf_impl.search. The loops know nothing of the network:
`torch_impl.decoding` drives them with the model (cached or recomputing), tests with fixed tables.

A step (`shared.decoding.Step`) declares ``vocab`` and ``dtype`` (they size the state before the
first step), gives ``initial_state()``, maps ``(prefixes, t, state)`` to ``(logits (N, V),
state)`` and ``reorder(state, rows)`` to the state after a beam selection. ``prefixes`` is the
whole buffer ``(N, 1 + T)`` int64 on ``device`` (BOS in column 0, the tokens chosen so far in
columns ``1 .. t``, pad after), ``t`` the step as a Python int; rows are ``n = item * beams +
beam``, and after a selection row ``n`` continues from row ``rows[n]`` ``(N,)``. A torch state may
be changed in place (the key/value cache is), as long as the step returns it. The loops never
change the logits they are given.

As in tf_impl.search, each search is a loop (`greedy_loop`, `beam_loop`: tensors in, a dict of
tensors out), a conversion (`greedy_result`, `beam_result`: NumPy results) and the two together
behind the spec's argument checks (`greedy_search`, `beam_search`). What differs is what each
framework can do inside its loop: here a bad step output (NaN or +inf in a live row, or every
logit but pad's -inf) raises the spec's ``ValueError`` from within the loop, at the one host read
a step makes (which also reads whether the search is over), where TF records it in its loop state
and raises afterwards.

Selection is on the logits and ties are broken explicitly (docs/design.md, convention 11): greedy
takes ``torch.max`` over the logits, documented to return the first maximal index; beam search
ranks each beam's tokens and then the candidates in the order of ``torch.sort(descending=True,
stable=True)`` (`_top_lowest`), never by ``torch.topk``'s order alone (whose tie order is not
promised).

``observe(t, top)``, when given, is called after every step with the best log-probs of that step,
sorted descending: ``(B, 2)`` in greedy (top-two margins), ``(B, 2K)`` candidate raw scores in beam
search (the 2K drawn; NaN for an item that has stopped, whose rows are not read). Tests and benchmarks use it to measure margins and per-step time; it
changes nothing in the search.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from shared.decoding import (BeamResult, GreedyResult, Step, bad_step_message, best_but_pad,
                             candidates_per_beam, check_beam_args, check_greedy_args, step_output)

Observe = Callable[[int, torch.Tensor], object]


class Hypotheses(NamedTuple):
    """K hypotheses per item, alive or finished (``scores``: raw for alive ones, ranking scores for
    finished ones; ``lengths`` only for finished ones: alive ones all have length t)."""
    scores: torch.Tensor  # (B, K)
    prefixes: torch.Tensor  # int64 (B, K, 1+T)
    step_scores: torch.Tensor  # (B, K, T)
    lengths: torch.Tensor  # int64 (B, K)


# -- helpers --------------------------------------------------------------------------------------
def _checked_step(step: Step, prefixes: torch.Tensor, t: int, state):
    """Run ``step``; its output must be a ``(rows, V)`` tensor in ``step.dtype``."""
    out, state = step_output(step(prefixes, t, state))
    rows = prefixes.shape[0]
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else np.shape(out)
    if not isinstance(out, torch.Tensor) or shape != (rows, step.vocab):
        raise ValueError(f"step: expected logits of shape ({rows}, {step.vocab}), got shape {shape}")
    if out.dtype != step.dtype:
        raise TypeError(f"step: expected logits of dtype {str(step.dtype)[6:]}, got {str(out.dtype)[6:]}")
    return out, state


def _call_step(step: Step, prefixes: torch.Tensor, t: int, state, read: torch.Tensor, pad_id: int):
    """Run ``step`` (`_checked_step`). Returns (logits with unread rows zeroed and pad at -inf, a
    new tensor; lse (N,); invalid (0-d bool, read at the step's one host read); state)."""
    out, state = _checked_step(step, prefixes, t, state)
    logits = torch.where(read[:, None], out, 0.0)  # an unread row may hold anything (a new tensor)
    lse = torch.logsumexp(logits, dim=-1)  # pad included: the model's own log-softmax
    logits[:, pad_id] = float("-inf")  # never generated (after lse: it stays in the softmax)
    # unreadable: NaN or +inf (lse), or no token but pad possible (every other logit -inf)
    invalid = ((~torch.isfinite(lse) | (logits.amax(dim=-1) == float("-inf"))) & read).any()
    return logits, lse, invalid, state


def _best_but(logits: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest logit and its token, pad left out (never generated), ties to the lowest
    id, without writing or copying the logits: the maxima left and right of pad (``torch.max``
    returns the first maximal index), the left one unless the right one is larger. Float32 and
    float64 logits on the CPU go through `shared.decoding.best_but_pad` on their own memory, the
    same choice (NumPy's argmax is vectorised where torch's max with indices is not).
    Shape: ``(N, V) -> ((N,), (N,) int64)``."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        best, tok = best_but_pad(logits.detach().numpy(), pad_id)
        return torch.from_numpy(best), torch.from_numpy(tok)
    if pad_id == 0:
        best, tok = logits[:, 1:].max(dim=-1)
        return best, tok + 1
    if pad_id == logits.shape[1] - 1:
        return logits[:, :-1].max(dim=-1)
    left, left_tok = logits[:, :pad_id].max(dim=-1)
    right, right_tok = logits[:, pad_id + 1:].max(dim=-1)
    take_right = right > left
    return torch.where(take_right, right, left), torch.where(take_right, right_tok + pad_id + 1, left_tok)


def _over(invalid: torch.Tensor, over: torch.Tensor, t: int) -> bool:
    """One host read per step: raise on a bad step output, else say whether the search is over."""
    bad, done = torch.stack([invalid, over]).tolist()
    if bad:
        raise ValueError(bad_step_message(t))
    return bool(done)


class _LaggedReads:
    """Greedy's one host read a step, on CUDA one step late: step ``t``'s flags (a bad step output,
    all finished) are copied to pinned host memory without waiting, and the loop reads step
    ``t - 1``'s, whose work the GPU has finished meanwhile, so the host launches step ``t + 1``
    while the GPU still runs step ``t`` instead of the two taking turns. The price is at most one
    step after every row finished, which changes no output (a finished row takes pad at log-prob 0
    and keeps its length); a bad step still raises, naming its own step. Elsewhere (the CPU, where
    nothing runs ahead) each step's flags are read at once.

    ``lag``: None for the device's way; True on the CPU reads one step late too, through plain
    copies, so that a machine without a GPU tests the lagged loop (parity_tests)."""

    def __init__(self, device: torch.device, lag: bool | None = None):
        self.lag = device.type == "cuda" if lag is None else lag
        self.events = None
        if self.lag:  # two host buffers, written in turn (allocating pinned memory is slow)
            pinned = device.type == "cuda"
            self.host = [torch.empty(2, dtype=torch.bool, pin_memory=pinned) for _ in range(2)]
            if pinned:
                self.events = [torch.cuda.Event(), torch.cuda.Event()]
        self.pending: int | None = None  # the step whose flags are in flight

    def over(self, invalid: torch.Tensor, over: torch.Tensor, t: int) -> bool:
        if not self.lag:
            return _over(invalid, over, t)
        slot = t % 2
        self.host[slot].copy_(torch.stack([invalid, over]), non_blocking=True)
        if self.events is not None:
            self.events[slot].record()
        previous, self.pending = self.pending, t
        return previous is not None and self._read(previous)

    def finish(self) -> None:
        """Read the last step's flags (raises on a bad step), when the loop ended without it."""
        if self.lag and self.pending is not None:
            self._read(self.pending)

    def _read(self, t: int) -> bool:
        if self.events is not None:
            self.events[t % 2].synchronize()
        bad, done = self.host[t % 2].tolist()
        if bad:
            raise ValueError(bad_step_message(t))
        self.pending = None if done else self.pending
        return bool(done)


def _top_lowest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last axis, best first, ties by lowest index: the first k
    of ``torch.sort(x, descending=True, stable=True)`` (NaN above everything, as that sort puts
    it). On the CPU, rows long against k go through `_topk_lowest`; a GPU, and rows of a few
    entries (k at least half of them: the search's merges of 2K hypotheses), take the sort itself.

    Why two ways: a stable sort of base's 37000-wide rows took more than half of a CPU beam step,
    where ``torch.topk`` and a fix of its ties cost a few percent; on a GPU the sort is one
    segmented kernel, and topk with its ties settled without a host read took more launches and
    more time (docs/performance.md, "Beam search on the CPU" and "The run of 2026-11-26 on an
    H200").

    Shape: ``(..., n) -> (..., k)`` int64, k <= n."""
    if x.device.type == "cpu" and 2 * k < x.shape[-1]:
        return _topk_lowest(x, k)
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def _topk_lowest(x: torch.Tensor, k: int) -> torch.Tensor:
    """`_top_lowest` by ``torch.topk`` of k + 1, for k < n: where the k-th value is larger than the
    (k+1)-th, those k entries are the sort's first k, and only their order among equal values is
    left to fix (a stable sort of k). The rows that tie across that boundary (or hold NaN there)
    are read from the device and go to `_lowest_tied`, which chooses among the tied entries by
    index. Shape: ``(..., n) -> (..., k)`` int64."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    values, top = torch.topk(rows, k + 1, dim=-1)  # sorted: the k-th largest at k - 1
    kth, top = values[:, k - 1:k], top[:, :k]
    tied = (values[:, k - 1] > values[:, k]).logical_not_().nonzero().view(-1)  # NaN there: tied
    if len(tied):
        top[tied] = _lowest_tied(rows[tied], kth[tied], k)
    top = top.sort(dim=-1).values  # ascending ids: the stable sort below keeps them on ties
    order = torch.sort(rows.gather(-1, top), dim=-1, descending=True, stable=True).indices
    return top.gather(-1, order).view(*x.shape[:-1], k)


def _lowest_tied(rows: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of `_topk_lowest`'s k entries of each row, whatever the ties: every entry above the
    row's k-th largest value ``kth`` (NaN counts as above everything), then as many of the entries
    equal to it as there is room for, lowest ids first. One ``topk`` of distinct integer keys
    ranks them so: above the k-th first, equal to it next, each group by ascending id (fewer than
    k entries are above it, unless ``kth`` is NaN: then the k lowest NaN ids are all of it).
    Shape: rows ``(R, n)``, kth ``(R, 1)`` -> ``(R, k)`` int64, in no particular order."""
    n = rows.shape[-1]
    dtype = torch.int32 if 3 * n < 2 ** 31 else torch.int64  # int32: fewer bytes a pass
    above = (rows > kth).logical_or_(rows.isnan())
    key = (rows >= kth).logical_or_(above).to(dtype)  # 1 at or above the k-th, 2 above it
    key += above
    key *= n
    key += torch.arange(n - 1, -1, -1, dtype=dtype, device=rows.device)  # larger for a lower id
    ranked = torch.topk(key, k, dim=-1).values
    return ((n - 1) - ranked % n).long()


def _penalty(length: int, alpha: float) -> float:
    """GNMT ``((5 + L) / 6) ** alpha`` as a Python float (float64, as the spec's)."""
    return ((5.0 + length) / 6.0) ** alpha


def _numpy(outputs: dict) -> dict:
    return {name: value.detach().cpu().numpy() for name, value in outputs.items()}


# -- greedy ---------------------------------------------------------------------------------------
def _put(x: torch.Tensor, column, values: torch.Tensor) -> None:
    """``x[:, column] = values``, ``column`` an int or a 0-d int64 tensor (a CUDA graph's step)."""
    if isinstance(column, torch.Tensor):
        x.index_copy_(1, column.view(1), values[:, None])
    else:
        x[:, column] = values


def _greedy_update(logits: torch.Tensor, prefixes: torch.Tensor, log_probs: torch.Tensor,
                  lengths: torch.Tensor, finished: torch.Tensor, t, eos_id: int,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of `greedy_loop` after its step: the best token of each live row appended at
    ``prefixes[:, t + 1]``, its log-prob at ``log_probs[:, t]``, ``lengths`` and ``finished``
    updated, all in place; ``t`` an int or a 0-d int64 tensor (`torch_impl.graphs` replays it).
    Returns ``(invalid (0-d bool): a live row's logits unreadable, lse (B,))``.

    Two passes over the (B, V) logits, which at batch 8 cost more than the rest of the loop:
    log-softmax's normaliser and the best token. An unread (finished) row may hold anything: its
    values reach no output (torch.where replaces them)."""
    lse = torch.logsumexp(logits, dim=-1)  # pad included: the model's own log-softmax
    best, tok = _best_but(logits, pad_id)  # on the logits, pad left out, lowest id on a tie
    live = ~finished
    # unreadable: NaN or +inf (lse), or no token but pad possible (best: nothing to choose)
    invalid = ((~torch.isfinite(lse) | (best == float("-inf"))) & live).any()
    chosen = torch.where(finished, pad_id, tok)  # a finished row takes pad, at log-prob 0
    _put(prefixes, t + 1, chosen)
    _put(log_probs, t, torch.where(finished, 0.0, best - lse))  # the log-prob, afterwards
    lengths += live  # True counts 1
    finished |= chosen == eos_id
    return invalid, lse


def greedy_loop(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                observe: Observe | None = None, *,
                device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The greedy loop of `shared.decoding.greedy_search` on tensors (no argument checks: see
    `greedy_search`). Returns tensors ``tokens (B, T)`` int64, ``log_probs (B, T)`` in
    ``step.dtype``, ``lengths (B,)`` int64 (T = max_len columns whatever step the loop stops at)."""
    dtype = step.dtype
    prefixes = torch.full((batch, max_len + 1), pad_id, dtype=torch.int64, device=device)  # (B, 1+T)
    prefixes[:, 0] = bos_id
    log_probs = torch.zeros(batch, max_len, dtype=dtype, device=device)
    lengths = torch.zeros(batch, dtype=torch.int64, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    state = step.initial_state()
    reads = _LaggedReads(torch.device(device))
    for t in range(max_len):
        logits, state = _checked_step(step, prefixes, t, state)  # (B, V)
        invalid, lse = _greedy_update(logits, prefixes, log_probs, lengths, finished, t, eos_id, pad_id)
        if observe is not None:
            others = logits.index_fill(1, torch.tensor([pad_id], device=logits.device), float("-inf"))
            observe(t, others.topk(2, dim=-1).values - lse[:, None])  # values only: no tie order
        if reads.over(invalid, finished.all(), t):
            break
    reads.finish()
    return {"tokens": prefixes[:, 1:], "log_probs": log_probs, "lengths": lengths}


def greedy_result(outputs: dict) -> GreedyResult:
    """`greedy_loop`'s tensors as the NumPy `GreedyResult`."""
    out = _numpy(outputs)
    return GreedyResult(out["tokens"], out["log_probs"], out["lengths"])


def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                  observe: Observe | None = None, *, device: torch.device | str = "cpu") -> GreedyResult:
    """Greedy decoding over ``step``; the algorithm of `shared.decoding.greedy_search`, with its
    argument checks (`shared.decoding.check_greedy_args`), on ``device``.

    Returns NumPy arrays: tokens ``(B, T)`` int64, log_probs ``(B, T)`` in the step's dtype,
    lengths ``(B,)`` int64 (T = max_len columns whatever step the loop stops at).
    """
    batch, max_len = check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)  # Python ints
    return greedy_result(greedy_loop(step, batch, max_len, bos_id, eos_id, pad_id, observe, device=device))


# -- beam search ----------------------------------------------------------------------------------
def _merge(finished: Hypotheses, new: Hypotheses, k: int) -> Hypotheses:
    """The best ``k`` of two sets of hypotheses, best first; ties: ``finished`` first, then index."""
    joined = [torch.cat([a, b], dim=1) for a, b in zip(finished, new)]
    keep = _top_lowest(joined[0], k)  # (B, k)
    items = torch.arange(keep.shape[0], device=keep.device)[:, None]
    return Hypotheses(*(x[items, keep] for x in joined))


def beam_loop(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
              pad_id: int, length_penalty: float = 0.0, observe: Observe | None = None, *,
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The beam loop of `shared.decoding.beam_search` on tensors, K alive and K finished hypotheses
    per item (no argument checks: see `beam_search`). Returns the tensors of every `BeamResult`
    field (``all_*`` included)."""
    dtype, vocab = step.dtype, step.vocab
    b_, k_ = batch, beam_size
    per_beam = candidates_per_beam(k_, vocab)
    alpha = float(length_penalty)
    items = torch.arange(b_, device=device)[:, None]  # (B, 1), for gathers
    prefixes = torch.full((b_, k_, max_len + 1), pad_id, dtype=torch.int64, device=device)  # alive
    prefixes[..., 0] = bos_id
    raw = torch.full((b_, k_), float("-inf"), dtype=dtype, device=device)
    raw[:, 0] = 0.0  # one real hypothesis: the first step has no duplicates
    step_scores = torch.zeros(b_, k_, max_len, dtype=dtype, device=device)
    finished = Hypotheses(torch.full((b_, k_), float("-inf"), dtype=dtype, device=device),
                          prefixes.clone(), step_scores.clone(),
                          torch.zeros(b_, k_, dtype=torch.int64, device=device))
    bound = _penalty(max_len, alpha)  # the largest penalty: the best a raw score can become
    alive_order = torch.arange(2 * k_, device=device)  # the 2K candidates' positions
    state = step.initial_state()
    for t in range(max_len):
        flat = prefixes.view(b_ * k_, max_len + 1)  # (B*K, 1+T)
        stopped = finished.scores.min(dim=1).values >= raw.max(dim=1).values / bound  # (B,)
        read = ((raw > float("-inf")) & ~stopped[:, None]).view(-1)  # rows of hypotheses, not stopped
        logits, lse, invalid, state = _call_step(step, flat, t, state, read, pad_id)  # (B*K, V)
        x = logits.view(b_, k_, vocab)
        top = _top_lowest(x, per_beam)  # (B, K, P): each beam's best tokens, by logit
        cand_lp = x.gather(-1, top) - lse.view(b_, k_, 1)  # (B, K, P)
        cand_raw = (raw[..., None] + cand_lp).reshape(b_, k_ * per_beam)
        order = torch.sort(cand_raw, dim=-1, descending=True, stable=True)
        best = order.indices[:, : 2 * k_]  # (B, 2K) positions beam * P + rank in beam
        src, tok = best // per_beam, top.reshape(b_, -1)[items, best]
        new_raw, new_lp = order.values[:, : 2 * k_], cand_lp.reshape(b_, -1)[items, best]
        eos = tok == eos_id
        grown = prefixes[items, src]  # (B, 2K, 1+T): the candidates' hypotheses
        grown[..., t + 1] = tok
        grown_scores = step_scores[items, src]
        grown_scores[..., t] = new_lp
        # EOS among the K best finishes (else -inf: nothing); the finished set keeps the best K.
        done = torch.where(eos[:, :k_], new_raw[:, :k_] / _penalty(t + 1, alpha), float("-inf"))
        finished = _merge(finished, Hypotheses(done, grown[:, :k_], grown_scores[:, :k_],
                                               torch.full((b_, k_), t + 1, device=device)), k_)
        alive = torch.sort(alive_order + 2 * k_ * eos, dim=-1).indices[:, :k_]  # first K not EOS
        prefixes, step_scores, raw = grown[items, alive], grown_scores[items, alive], new_raw[items, alive]
        state = step.reorder(state, (items * k_ + src[items, alive]).view(-1))  # (B*K,) source rows
        if observe is not None:
            observe(t, torch.where(stopped[:, None], float("nan"), new_raw))  # nothing decided there
        over = (finished.scores.min(dim=1).values >= raw.max(dim=1).values / bound).all()
        if _over(invalid, over, t):
            break
    length = t + 1  # every alive hypothesis's
    scores, prefixes, step_scores, lengths = _merge(
        finished, Hypotheses(raw / _penalty(length, alpha), prefixes, step_scores,
                             torch.full((b_, k_), length, device=device)), k_)
    tokens = prefixes[..., 1:]
    return {"tokens": tokens[:, 0], "scores": scores[:, 0], "step_scores": step_scores[:, 0],
            "lengths": lengths[:, 0], "all_tokens": tokens, "all_scores": scores, "all_lengths": lengths}


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
                observe: Observe | None = None, *, device: torch.device | str = "cpu") -> BeamResult:
    """Beam search over ``step`` (rows ``item * beam_size + beam``); the algorithm of
    `shared.decoding.beam_search`, in the step's dtype, with its argument checks
    (`shared.decoding.check_beam_args`), on ``device``. Returns NumPy arrays, shapes as
    `shared.decoding.BeamResult`.
    """
    batch, max_len, beam_size = check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                                length_penalty)  # Python ints
    return beam_result(beam_loop(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                 length_penalty, observe, device=device), return_all)
