"""Greedy decoding and beam search over a step function: the one specification every backend mirrors.

The search is framework-free NumPy and knows nothing of the network. It drives a *step* (`Step`),
the one contract of this spec, torch_impl.search and tf_impl.search alike::

    step.vocab: int                       V, the width of the log-probs (it sizes the loop state)
    step.dtype                            the log-probs' dtype (NumPy, torch or TF dtype)
    step.initial_state() -> state         what the step carries from one call to the next; ()
                                          for a stateless step
    step(prefixes, t, state) -> (log_probs (N, V), state)
    step.reorder(state, rows) -> state    after each beam selection: row n continues row rows[n]

``prefixes`` is the whole fixed buffer ``(N, 1 + T)`` int64: the start token in column 0 (the
searches' ``bos_id`` argument: a model passes ``config.start_id``, its ``decoder_start_id`` or else
BOS; it may equal ``pad_id``), the tokens chosen so far in columns ``1 .. t``, pad after; ``t`` is
the step index (a Python int in NumPy and torch, an int32 scalar tensor in TF). Rows are
``n = item * beams + beam`` (beams = 1 for greedy). A step reads what it needs: ``prefixes[:, :t+1]`` to recompute the decoder on the prefix (the oracle,
`stateless_step`), column ``t`` alone with a key/value cache (its state). ``reorder`` gets
``rows (N,)``, each in the same item as its row. The state is opaque to the loops: they pass it
from the step's output to its next input, through ``reorder``, and never look inside, so a
compiled loop (tf_impl's ``tf.while_loop``) can carry it as a nested structure of tensors.

The float64 oracle wraps the reference model in such a step (`shared.reference.greedy_decode`,
`.beam_search`); tests wrap fixed tables with `stateless_step` (as fairseq's
``test_sequence_generator`` does), so the search logic is tested apart from the network. torch_impl
and tf_impl implement the same algorithm on tensors, step for step, as written here.

Definitions (B = batch, K = beam_size, V = vocabulary, T = max_len)
-------------------------------------------------------------------
* **Pad is never generated.** Before any selection the step's log-prob of ``pad_id`` is replaced by
  ``-inf`` for every live row (fairseq does the same). Pad means "no token" in the output, and a pad
  inside a prefix would be hidden from later steps by the padding-derived target mask in a
  recomputing decoder but not in a cached one. Hence ``beam_size <= V - 1``.
* **Length** of a hypothesis = number of generated tokens, EOS included, BOS excluded; frozen once
  the hypothesis has emitted EOS ("finished").
* **Length penalty** (GNMT, Wu et al. 2016): ``penalty(L) = ((5 + L) / 6) ** alpha``, computed in
  that order, in the score dtype; ``alpha = 0`` gives exactly 1.0, so the ranking is the raw score.
* **Ranking score** = ``raw / penalty(length)``; ``raw`` is the sum of the chosen tokens' log-probs,
  accumulated one step at a time (``raw += log_prob``). Reported scores are ranking scores.
* **Ties** (docs/design.md, convention 11): the highest score wins; among equal scores the lowest
  token id, and in beam search the lowest flattened index ``beam * V + token`` (lowest beam, then
  lowest id). Never rely on a library's argmax or top-k tie order unless it is documented to be this
  one (``np.argsort(-x, kind="stable")``, ``torch.sort(descending=True, stable=True)`` and
  ``tf.math.top_k`` are; ``torch.topk`` and ``torch.argmax`` do not promise it).

Greedy (`greedy_search`)
------------------------
State: ``prefixes (B, 1+T)`` (column 0 = BOS, the rest pad), ``finished (B,)``, outputs, the step's
state. For ``t = 0 .. T-1``: ``lp, state = step(prefixes, t, state)``; ``lp[:, pad] = -inf``; the
row of a finished item becomes ``-inf`` everywhere except ``0`` at ``pad`` (its step output is
ignored); ``tok`` = the lowest id with ``lp == max(lp)`` (so a finished row takes pad with log-prob
0); write ``tok`` to ``prefixes[:, t+1]`` and its log-prob to ``log_probs[:, t]``; a row that was
live gets ``lengths += 1`` and becomes finished if ``tok == eos``. Stop after the step where every
row is finished, or after T steps; ``tokens = prefixes[:, 1:]``. Beam search with ``beam_size = 1``
gives the same tokens (with ``alpha = 0`` also the same score, ``sum(log_probs)``; with
``alpha > 0`` a rounding tie after the division could in principle differ).

Beam search (`beam_search`)
---------------------------
State, per item ``b`` and beam ``k``: ``raw (B, K)`` = ``[0, -inf, ..., -inf]`` (one live beam, so
the first step has no duplicates), ``lengths (B, K) = 0``, ``finished (B, K) = False``, ``prefixes
(B*K, 1+T)`` (BOS then pad), ``step_scores (B, K, T) = 0``, ``rank (B, K)``, the step's state.
For ``t = 0 .. T-1``:

1. ``lp, state = step(prefixes, t, state)``; ``lp = lp.reshape(B, K, V)``; ``lp[..., pad] = -inf``.
2. A finished beam proposes exactly one candidate, itself extended by pad at +0: its row of ``lp``
   becomes ``-inf`` everywhere except ``0`` at ``pad`` (its step output is ignored).
3. ``cand_raw = raw[..., None] + lp`` (B, K, V); ``cand_len = lengths + (not finished)`` (B, K);
   ``cand_rank = cand_raw / penalty(cand_len)[..., None]``.
4. Flatten to (B, K*V) and keep the first K of a stable descending sort of ``cand_rank``:
   ``order``; ``src_beam = order // V``, ``tok = order % V``.
5. Gather by ``src_beam``: ``prefixes``, ``step_scores``, ``lengths = cand_len``, ``finished``; then
   ``raw``, ``rank`` = the kept candidates' values; ``prefixes[:, t+1] = tok``;
   ``step_scores[..., t] = lp[src_beam, tok]`` (0 for a finished beam);
   ``finished |= (tok == eos)``; ``state = step.reorder(state, item * K + src_beam)``.
6. Stop when every beam of every item is finished (or after T steps).

The kept beams are in ranking order (best first, ties by flat index), so the result for an item
is beam 0: its tokens ``prefixes[1:]``, score ``rank``, ``step_scores``, length. ``return_all`` gives
all K in that order. A hypothesis still live at T steps is ranked like any other (length T).

Why finished beams stay in the beam, frozen: this keeps K, every shape and the whole state fixed,
with no separate list of finished hypotheses, so the loop is one ``tf.while_loop`` with shape
invariants (the torch loop is the same code path). Log-probs are <= 0, so a live beam's raw score
only falls. With ``alpha = 0`` a finished beam that ranks first therefore stays first: the best
result is final as soon as beam 0 is finished; the loop still runs until all beams are finished
because ``return_all`` reports them all, and the results are identical either way. With
``alpha > 0`` a longer hypothesis's penalty grows and its ranking can rise, so no such shortcut.
A finished beam can be pushed out by K better candidates; a frozen beam's ranking never changes.

Known limitation of this design (kept for its simplicity): there is no separate list of finished
hypotheses, so an EOS candidate that never ranks in the top K is forgotten. When K live beams keep
outranking every EOS child, nothing finishes and the result is a live hypothesis at ``max_len``, which
can score below a finished one seen earlier, or below greedy (measured: 1 item in 240 on random tiny
models, ``max_len`` 12, K 4). tensor2tensor's fixed-shape search avoids this with K alive plus K
finished slots, drawing 2K candidates a step; adopting it would change this spec in every backend.

Fixed-shape loop: the state above is the loop state; ``cond = t < T and not all(finished)``. Once
every beam is finished a step is the identity on the state (each beam keeps itself, in order), so
running all T steps gives the same result as stopping early. Outputs keep T columns whatever step
the loop stops at: pad tokens and zero scores after EOS. A recomputing step reads
``prefixes[:, :t+1]``; a cached step reads ``prefixes[:, t]`` and reorders its cache by ``src_beam``.

Inputs and edge cases
---------------------
* The search runs in the dtype of the log-probs: float64 here (the oracle, whatever ``step.dtype``
  says), ``step.dtype`` in a backend (float32 ties and near-ties are what the parity tests report).
* ``max_len`` counts new tokens, EOS included; the longest prefix fed is BOS + ``max_len - 1``
  tokens, so a model needs ``max_len <= config.max_len``.
* ``step.vocab`` is an int >= 2; the ids and the beam size are checked against it before the first
  step (`check_greedy_args`, `check_beam_args`, shared by the backends).
* Step output must be (N, step.vocab) at every step, without NaN or +inf in the rows of live
  beams (``-inf`` means impossible). If fewer than K candidates are finite (a table with ``-inf``
  entries), ``-inf`` candidates fill the beam by the same tie rule; they never win unless all do.
* Bad arguments raise the errors of `check_max_len`, `check_beam_size`, `check_length_penalty`
  (the backends call these same functions, so the messages are identical). A model-level API checks,
  in this order: ``src`` (`shared.checks.check_ids`, `check_ids_range`), `check_search_args`, masks.
* All-padding sources are allowed: the model is well defined on them (docs/design.md, convention 3:
  an attention row with no allowed key is all zeros, so the cross-attention contributes nothing) and
  they decode deterministically, like any other source, from the decoder's own state.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from .config import TransformerConfig


class Step(Protocol):
    """The step contract of the module docstring, shared by the NumPy spec and both backends."""
    vocab: int
    dtype: Any

    def initial_state(self) -> Any: ...

    def __call__(self, prefixes, t, state) -> tuple[Any, Any]: ...

    def reorder(self, state, rows) -> Any: ...


class StatelessStep:
    """A `Step` without state of its own, from ``fn(prefix) -> log_probs``: each call passes
    ``fn`` the prefix so far, ``prefixes[:, :t+1]`` ``(N, t+1)`` (BOS first), and ``fn`` returns
    ``(N, vocab)`` log-probs in ``dtype``; ``reorder`` has nothing to move. The oracle's step
    (`shared.reference`) and the tests' fixed tables are such steps; it also works as a torch step
    (``fn`` then takes and returns tensors; ``t`` is a Python int there too)."""

    def __init__(self, fn: Callable, vocab: int, dtype: Any = np.float64):
        self.fn, self.vocab, self.dtype = fn, vocab, dtype

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        return self.fn(prefixes[:, : t + 1]), state

    def reorder(self, state, rows):
        return state


def stateless_step(fn: Callable, vocab: int, dtype: Any = np.float64) -> StatelessStep:
    """``StatelessStep(fn, vocab, dtype)``: the step of ``fn(prefix (N, t+1)) -> log_probs (N, V)``."""
    return StatelessStep(fn, vocab, dtype)


class GreedyResult(NamedTuple):
    """tokens (B, T) int64 without BOS, pad after EOS; log_probs (B, T), 0 after EOS; lengths (B,)
    = generated tokens including EOS."""
    tokens: np.ndarray
    log_probs: np.ndarray
    lengths: np.ndarray


class BeamResult(NamedTuple):
    """The best beam per item: tokens (B, T), scores (B,) ranking scores, step_scores (B, T)
    per-token log-probs (0 after EOS), lengths (B,). With ``return_all``: every kept beam, best
    first: all_tokens (B, K, T), all_scores (B, K), all_lengths (B, K); otherwise None."""
    tokens: np.ndarray
    scores: np.ndarray
    step_scores: np.ndarray
    lengths: np.ndarray
    all_tokens: np.ndarray | None = None
    all_scores: np.ndarray | None = None
    all_lengths: np.ndarray | None = None


# -- argument checks (shared verbatim by the backends) --------------------------------------------
def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_max_len(max_len, limit: int | None = None) -> None:
    """``max_len`` (new tokens, EOS included) is an int >= 1; with a model, the longest prefix fed
    (BOS + max_len - 1 tokens) must fit the positional table, so ``max_len <= config.max_len``."""
    if not _is_int(max_len) or max_len < 1:
        raise ValueError(f"max_len: expected an int >= 1, got {max_len!r}")
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len: expected at most config.max_len={limit} (the positional table "
                         f"covers BOS plus max_len - 1 tokens), got {max_len}")


def check_beam_size(beam_size, vocab: int | None = None) -> None:
    """``beam_size`` is an int in [1, vocab - 1]: pad is never generated, so a beam has V - 1 children."""
    if not _is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size: expected an int >= 1, got {beam_size!r}")
    if vocab is not None and beam_size > vocab - 1:
        raise ValueError(f"beam_size: expected at most tgt_vocab - 1 = {vocab - 1} (pad is never "
                         f"generated), got {beam_size}")


def check_length_penalty(alpha) -> None:
    """``alpha`` is a finite real >= 0 (0 = no penalty)."""
    real = isinstance(alpha, (int, float, np.integer, np.floating))
    if not real or isinstance(alpha, (bool, np.bool_)) or not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"length_penalty: expected a finite float >= 0 (GNMT alpha; 0 = none), "
                         f"got {alpha!r}")


def check_search_args(config: TransformerConfig, max_len, beam_size=None, length_penalty=0.0) -> None:
    """All decoding arguments of a model-level API, in the fixed order (after the source checks)."""
    check_max_len(max_len, config.max_len)
    if beam_size is not None:
        check_beam_size(beam_size, config.tgt_vocab)
    check_length_penalty(length_penalty)


def length_penalty(length, alpha: float) -> np.ndarray:
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` in float64; exactly 1.0 when alpha = 0."""
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** float(alpha)


_length_penalty = length_penalty  # beam_search's argument of the same name shadows the function


# -- helpers --------------------------------------------------------------------------------------
def _argmax_lowest(x: np.ndarray) -> np.ndarray:
    """Index of the maximum along the last axis, the lowest index among equal maxima (explicit)."""
    ids = np.arange(x.shape[-1])
    best = x.max(axis=-1, keepdims=True)
    return np.where(x == best, ids, x.shape[-1]).min(axis=-1)


def _top_k_lowest(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis, best first, ties by lowest index.
    ``-x`` turns a stable ascending sort into a descending one that keeps index order on ties."""
    return np.argsort(-x, axis=-1, kind="stable")[..., :k]


def _call_step(step: Step, prefixes: np.ndarray, t: int, state, live: np.ndarray):
    """Run ``step`` on a copy of the buffer (a step cannot change the loop's prefixes) and check its
    output: ``(N, step.vocab)``, no NaN or +inf in live rows. Returns (float64 log-probs, state)."""
    out, state = step(prefixes.copy(), t, state)
    out = np.asarray(out, dtype=np.float64)
    n, vocab = prefixes.shape[0], step.vocab
    if out.shape != (n, vocab):
        raise ValueError(f"step: expected log-probs of shape ({n}, {vocab}), got shape {out.shape}")
    rows = out[live]
    if np.isnan(rows).any() or np.isposinf(rows).any():
        raise ValueError(f"step: expected log-probs without NaN or +inf (step {t})")
    return out, state


def _frozen_row(vocab: int, pad_id: int) -> np.ndarray:
    """The log-probs a finished row proposes: pad at +0, everything else impossible."""
    row = np.full(vocab, -np.inf)
    row[pad_id] = 0.0
    return row


def _check_ids(vocab: int, bos_id: int, eos_id: int, pad_id: int) -> None:
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if not _is_int(value) or not 0 <= value < vocab:
            raise ValueError(f"{name}: expected an int in [0, {vocab}), got {value!r}")
    # bos_id is the start token of column 0 (a model's ``config.start_id``); it may be pad
    # (Marian's decoder_start_id), which the target mask then keeps (`shared.masks`). EOS may not:
    # an EOS equal to pad would make every finished row look live and vice versa.
    if pad_id == eos_id:
        raise ValueError(f"pad_id: expected an id different from eos_id, got {pad_id}")


def _check_batch(batch) -> None:
    if not _is_int(batch) or batch < 1:
        raise ValueError(f"batch: expected an int >= 1, got {batch!r}")


def _check_vocab(step) -> int:
    vocab = getattr(step, "vocab", None)
    if not _is_int(vocab) or vocab < 2:
        raise ValueError(f"step.vocab: expected an int >= 2 (the width of the log-probs), got {vocab!r}")
    return int(vocab)


def check_greedy_args(step: Step, batch, max_len, bos_id, eos_id, pad_id) -> None:
    """The arguments of a greedy search, all before the first step (V is ``step.vocab``); the
    backends call this same function, so the errors are identical."""
    _check_batch(batch)
    check_max_len(max_len)
    _check_ids(_check_vocab(step), bos_id, eos_id, pad_id)


def check_beam_args(step: Step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                    length_penalty) -> None:
    """The arguments of a beam search, in this order, all before the first step."""
    _check_batch(batch)
    check_max_len(max_len)
    check_beam_size(beam_size)
    check_length_penalty(length_penalty)
    vocab = _check_vocab(step)
    _check_ids(vocab, bos_id, eos_id, pad_id)
    check_beam_size(beam_size, vocab)


# -- the searches ---------------------------------------------------------------------------------
def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int,
                  pad_id: int) -> GreedyResult:
    """Greedy decoding over ``step`` (a `Step`); see the module docstring for the exact algorithm."""
    check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)
    vocab = step.vocab
    prefixes = np.full((batch, max_len + 1), pad_id, dtype=np.int64)  # (B, 1+T)
    prefixes[:, 0] = bos_id
    log_probs = np.zeros((batch, max_len))
    lengths = np.zeros(batch, dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    state = step.initial_state()
    for t in range(max_len):
        lp, state = _call_step(step, prefixes, t, state, ~finished)  # (B, V)
        lp[:, pad_id] = -np.inf
        lp[finished] = _frozen_row(vocab, pad_id)  # a finished row can only take pad, at +0
        tok = _argmax_lowest(lp)
        log_probs[:, t] = lp[np.arange(batch), tok]
        prefixes[:, t + 1] = tok
        lengths += ~finished
        finished |= tok == eos_id
        if finished.all():
            break
    return GreedyResult(prefixes[:, 1:], log_probs, lengths)


def beam_search(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
                pad_id: int, length_penalty: float = 0.0, return_all: bool = False) -> BeamResult:
    """Beam search over ``step`` (a `Step`; rows ``item * beam_size + beam``); see the module
    docstring."""
    check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id, length_penalty)
    alpha, vocab = length_penalty, step.vocab
    b_, k_ = batch, beam_size
    items = np.arange(b_)[:, None]  # (B, 1), for gathers
    prefixes = np.full((b_, k_, max_len + 1), pad_id, dtype=np.int64)  # (B, K, 1+T)
    prefixes[..., 0] = bos_id
    raw = np.full((b_, k_), -np.inf)
    raw[:, 0] = 0.0
    rank = raw.copy()
    lengths = np.zeros((b_, k_), dtype=np.int64)
    finished = np.zeros((b_, k_), dtype=bool)
    step_scores = np.zeros((b_, k_, max_len))
    state = step.initial_state()
    for t in range(max_len):
        flat_prefixes = prefixes.reshape(b_ * k_, max_len + 1)  # (B*K, 1+T)
        out, state = _call_step(step, flat_prefixes, t, state, ~finished.reshape(-1))  # (B*K, V)
        lp = out.reshape(b_, k_, vocab)  # (B, K, V)
        lp[..., pad_id] = -np.inf
        lp[finished] = _frozen_row(vocab, pad_id)  # a finished beam proposes only itself + pad, at +0
        cand_raw = raw[..., None] + lp  # (B, K, V)
        cand_len = lengths + ~finished  # (B, K)
        cand_rank = cand_raw / _length_penalty(cand_len, alpha)[..., None]  # (B, K, V)
        order = _top_k_lowest(cand_rank.reshape(b_, k_ * vocab), k_)  # (B, K), flat beam * V + token
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
        if finished.all():
            break
    best = _argmax_lowest(rank)  # always 0: the beams are kept in ranking order
    pick = (np.arange(b_), best)
    result = BeamResult(prefixes[pick][:, 1:], rank[pick], step_scores[pick], lengths[pick])
    if return_all:
        result = result._replace(all_tokens=prefixes[..., 1:], all_scores=rank, all_lengths=lengths)
    return result

