"""Greedy decoding and beam search over a step function: the one specification every backend mirrors.

The search is framework-free NumPy and knows nothing of the network. It drives a *step* (`Step`),
the one contract of this spec, torch_impl.search and tf_impl.search alike::

    step.vocab: int                       V, the width of the logits (it sizes the loop state)
    step.dtype                            the logits' dtype (NumPy, torch or TF dtype)
    step.initial_state() -> state         what the step carries from one call to the next; ()
                                          for a stateless step
    step(prefixes, t, state) -> (logits (N, V), state)
    step.reorder(state, rows) -> state    after each beam selection: row n continues row rows[n]

``prefixes`` is the whole fixed buffer ``(N, 1 + T)`` int64: the start token in column 0 (the
searches' ``bos_id`` argument: a model passes ``config.start_id``, its ``decoder_start_id`` or else
BOS; it may equal ``pad_id``), the tokens chosen so far in columns ``1 .. t``, pad after; ``t`` is
the step index (a Python int in NumPy and torch, an int32 scalar tensor in TF). Rows are
``n = item * beams + beam`` (beams = 1 for greedy). A step reads what it needs:
``prefixes[:, :t+1]`` to recompute the decoder on the prefix (the oracle, `stateless_step`), column
``t`` alone with a key/value cache (its state). ``reorder`` gets ``rows (N,)``, each in the same
item as its row. The state is opaque to the loops, so a compiled loop (tf_impl's
``tf.while_loop``) can carry it as a nested structure of tensors.

The step returns **logits**, unnormalised scores; the search normalises them itself. The float64
oracle wraps the reference model in such a step (`shared.reference`); tests wrap fixed tables with
`stateless_step` (as fairseq's ``test_sequence_generator`` does), so the search logic is tested
apart from the network. torch_impl and tf_impl implement the same algorithm on tensors.

Definitions (B = batch, K = beam_size, V = vocabulary, T = max_len)
-------------------------------------------------------------------
* **Log-probs** of a row are ``logits - lse``, ``lse = m + log(sum(exp(logits - m)))`` with ``m``
  the row's maximum (each framework's own logsumexp: its exp may differ from NumPy's by an ulp).
  Pad takes part in ``lse``: a reported log-prob is the model's log-softmax, as before.
* **Selection is on the logits** (docs/design.md, convention 11): log-softmax is monotone, so the
  order of a row's logits is the order of its log-probs, without the ties float32 invents
  (log-probs near -7 are spaced ~5e-7 apart, more than real gaps between logits). The chosen
  tokens' log-probs are computed afterwards.
* **Pad is never generated**: its logit is replaced by ``-inf`` before any selection (after
  ``lse``), as fairseq does. Pad means "no token" in the output. Hence ``beam_size <= V - 1``.
* **Ties**: among equal logits the lowest token id; in beam search, among candidates of equal
  score, the lower beam, and within a beam the higher logit, then the lower id (the flat index
  ``beam * V + token`` where logits tie). Never a library's argmax or top-k tie order unless it is
  documented to be this one (``np.argsort(-x, kind="stable")``, ``torch.max``/``torch.argmax``
  (first maximal index), ``torch.sort(stable=True)`` and ``tf.math.top_k`` are; ``torch.topk`` and
  ``tf.math.argmax`` do not promise it).
* **Length** of a hypothesis = generated tokens, EOS included, the start token excluded.
* **Length penalty** (GNMT, Wu et al. 2016): ``penalty(L) = ((5 + L) / 6) ** alpha``, in that
  order, in the score dtype; ``alpha = 0`` gives exactly 1.0. **Raw score** = the sum of the chosen
  tokens' log-probs, accumulated one step at a time; **score** of a finished hypothesis =
  ``raw / penalty(length)``. Reported scores are these.
* A live row with NaN or +inf, or with every logit but pad's -inf (no token it could choose), is
  refused (`bad_step_message`); rows the search does not read (finished in greedy, impossible
  beams) are never checked.

Greedy (`greedy_search`)
------------------------
For ``t = 0 .. T-1``: ``logits = step(prefixes, t)``; for each live row ``tok`` = the lowest id of
the maximal logit, pad excluded, its log-prob ``logits[tok] - lse``; a finished row takes pad at
log-prob 0. Write ``tok`` to ``prefixes[:, t+1]``; a live row gets ``lengths += 1`` and finishes if
``tok == eos``. Stop after the step where every row is finished, or after T steps.

Beam search (`beam_search`): K alive and K finished hypotheses per item
------------------------------------------------------------------------
State per item: **alive** ``prefixes (K, 1+T)``, ``raw (K)`` = ``[0, -inf, ..]`` (one real
hypothesis, so the first step has no duplicates), ``step_scores (K, T)``; every alive hypothesis
has length ``t``. **Finished** ``prefixes (K, 1+T)``, ``scores (K)`` = -inf (empty slots),
``step_scores``, ``lengths``, best first. All shapes are fixed. For ``t = 0 .. T-1``:

1. ``logits = step(alive prefixes, t)`` (B*K, V). A row is read only for an alive slot that
   holds a hypothesis (``raw > -inf``) of an item that has not stopped (step 6); the others are
   taken as zeros (whatever the step returned there).
2. Each beam proposes its ``2K`` best tokens by logit (`candidates_per_beam`: all V when fewer),
   pad excluded, each with ``cand_raw = raw + logits[tok] - lse``.
3. Of those K * 2K candidates, keep the best ``2K`` by ``cand_raw`` (ties: lower beam, then the
   beam's own order). Every alive hypothesis has the same length, so ranking by raw score is
   ranking by score whatever alpha.
4. **Finish**: a candidate among the best **K** of the 2K that ends in EOS becomes a finished
   hypothesis with score ``cand_raw / penalty(t + 1)``; the finished set becomes the best K of the
   old K and these (ties: the old first). A finished hypothesis leaves only when K better ones
   have finished: it is never lost to live hypotheses. (An EOS candidate ranked K+1 .. 2K is
   pruned, as any candidate below the K best, as fairseq and Hugging Face do; this is what makes
   beam size 1 greedy.)
5. **Alive**: the first K of the 2K that do not end in EOS (there are at least K: a beam
   proposes EOS once); ``state = step.reorder(state, item * K + their source beam)``.
6. **Stop** an item when no alive hypothesis can still enter its finished set: ``min(finished
   scores) >= max(alive raw) / penalty(T)``. Log-probs are <= 0, so a raw score only falls and
   ``raw / penalty(L) <= raw / penalty(T)`` for every ``L <= T``: once true it stays true, and a
   stopped item's result no longer changes (the loop may run on for other items). The loop stops
   when every item has, or after T steps.

Then the alive hypotheses join the finished set as if they ended there (score ``raw /
penalty(length)``; ties: the finished first): at T this ranks a hypothesis still live like any
other; after an early stop it changes nothing (step 6). The result is that set, best first:
``tokens = prefixes[1:]``, score, step_scores, length of slot 0; ``return_all`` gives all K.

With ``beam_size = 1`` and ``alpha = 0`` the result is greedy's: the one alive hypothesis takes
greedy's token, an EOS finishes only when it is the best candidate, and then nothing alive can beat
it. With ``alpha > 0`` the search goes on while a longer hypothesis could still outrank greedy's,
so it returns greedy's hypothesis or a better-scoring one.

Fixed-shape loop: the state above is the loop state; ``cond = t < T and not all(stopped)``.
Outputs keep T columns whatever step the loop stops at: pad tokens and zero scores after EOS.

Inputs and edge cases
---------------------
* The search runs in the dtype of the logits: float64 here (the oracle, whatever ``step.dtype``
  says), ``step.dtype`` in a backend.
* ``max_len`` counts new tokens, EOS included; the longest prefix fed is BOS + ``max_len - 1``
  tokens, so a model needs ``max_len <= config.max_len``.
* ``step.vocab`` is an int >= 2; the ids and the beam size are checked against it before the first
  step (`check_greedy_args`, `check_beam_args`, shared by the backends, `shared.decoding_args`).
* Bad arguments raise the errors of `check_max_len`, `check_beam_size`, `check_length_penalty`
  (the backends call these same functions, so the messages are identical). A model-level API
  checks, in this order: ``src`` (`shared.checks.check_ids`, `check_ids_range`),
  `check_search_args`, masks.
* All-padding sources are allowed: the model is well defined on them (docs/design.md, convention 3)
  and they decode deterministically, from the decoder's own state.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from .decoding_args import (GREEDY, BeamResult, GreedyResult, bad_step_message, candidates_per_beam,  # noqa: F401
                            check_beam_args, check_beam_size, check_flags, check_greedy_args, check_length_penalty,
                            check_max_len, check_search_args, step_output)


class Step(Protocol):
    """The step contract of the module docstring, shared by the NumPy spec and both backends."""
    vocab: int
    dtype: Any

    def initial_state(self) -> Any: ...

    def __call__(self, prefixes, t, state) -> tuple[Any, Any]: ...

    def reorder(self, state, rows) -> Any: ...


class StatelessStep:
    """A `Step` without state of its own, from ``fn(prefix) -> logits``: each call passes ``fn``
    the prefix so far, ``prefixes[:, :t+1]`` ``(N, t+1)`` (BOS first), and ``fn`` returns
    ``(N, vocab)`` logits in ``dtype`` (log-probs are logits too); ``reorder`` has nothing to move.
    The oracle's step (`shared.reference`) and the tests' fixed tables are such steps; it also
    works as a torch step (``fn`` then takes and returns tensors)."""

    def __init__(self, fn: Callable, vocab: int, dtype: Any = np.float64):
        self.fn, self.vocab, self.dtype = fn, vocab, dtype

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        return self.fn(prefixes[:, : t + 1]), state

    def reorder(self, state, rows):
        return state


def stateless_step(fn: Callable, vocab: int, dtype: Any = np.float64) -> StatelessStep:
    """``StatelessStep(fn, vocab, dtype)``: the step of ``fn(prefix (N, t+1)) -> logits (N, V)``."""
    return StatelessStep(fn, vocab, dtype)


def length_penalty(length, alpha: float) -> np.ndarray:
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` in float64; exactly 1.0 when alpha = 0."""
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** float(alpha)


_length_penalty = length_penalty  # beam_search's argument of the same name shadows the function


def logsumexp(x: np.ndarray) -> np.ndarray:
    """``m + log(sum(exp(x - m)))`` over the last axis, ``m`` the maximum (taken as 0 when it is not
    finite, as torch.logsumexp and tf.reduce_logsumexp do): a row with NaN gives NaN, with +inf
    +inf, all -inf gives -inf."""
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (np.log(np.exp(x - m).sum(axis=-1, keepdims=True)) + m)[..., 0]


# -- helpers --------------------------------------------------------------------------------------
def _top_lowest(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis, best first, ties by lowest index, NaN after
    everything (-inf included): the first k of the stable ascending sort of the key ``-x``
    (``np.argsort(-x, kind="stable")``: negation turns the stable ascending sort into a descending
    one that keeps index order on ties; NumPy sorts NaN last), without sorting the whole row.
    Integers and bools take ``~x`` (``-x - 1``) as the key, which cannot overflow (``-x`` wraps at
    the minimum, and for every unsigned value); a float dtype NumPy does not sort itself (ml_dtypes'
    bfloat16: NaN not ordered) is widened to float64 first, exactly.

    k = 1 is ``np.argmax`` (documented to return the first occurrence of the maximum) unless it
    lands on a NaN (argmax takes NaN as the maximum); otherwise only the keys at or below the row's
    k-th smallest key (``np.partition``) are sorted, in index order, stably: the first k of the
    whole sort are among them, in the same order (the whole row when that key is NaN). A sort of
    whole 37000-wide rows cost more than a decoder step of ``base`` (docs/performance.md). The
    search itself only passes float64 rows without NaN."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        x = x.astype(np.float64)
    integer, n = x.dtype.kind in "biu", x.shape[-1]
    if k == 1 and n > 1:
        best = np.argmax(x, axis=-1)[..., None]
        if integer or not np.isnan(np.take_along_axis(x, best, axis=-1)).any():
            return best
    key = ~x if integer else -x
    if k >= n:
        return np.argsort(key, axis=-1, kind="stable")[..., :k]
    rows = key.reshape(-1, n)
    kth = np.partition(rows, k - 1, axis=-1)[:, k - 1]  # each row's k-th smallest key (NaN last)
    out = np.empty((rows.shape[0], k), dtype=np.int64)
    for r, (row, threshold) in enumerate(zip(rows, kth)):
        # ascending index; at least k of them (NaN compares false: a NaN k-th key takes the row)
        candidates = np.flatnonzero(row <= threshold) if threshold == threshold else np.arange(n)
        out[r] = candidates[np.argsort(row[candidates], kind="stable")[:k]]
    return out.reshape(x.shape[:-1] + (k,))


def best_but_pad(logits: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy's choice on the logits themselves, without writing them: each row's largest value
    among the tokens but pad and the lowest id holding it (convention 11). A row's first maximum
    (``np.argmax`` returns the first) is its best token unless it is pad: no lower id holds that
    value, pad included. The rows whose first maximum is pad (those rows copied) take the maxima
    left and right of it, the left one unless the right one is larger. A row holding NaN may
    answer any token but pad: its log-sum-exp is NaN too, so a search reads no token from it.
    What torch_impl's greedy takes on the CPU, where ``torch.max`` with indices runs a scalar loop
    and NumPy's ``argmax`` a vectorised one (docs/performance.md, "A step's Python").
    Shape: ``(N, V)``, V >= 2 -> ``(best (N,) in the logits' dtype, tok (N,) int64)``."""
    tok = logits.argmax(axis=1)
    on_pad = np.flatnonzero(tok == pad_id)
    if len(on_pad):
        rows = logits[on_pad]
        left = rows[:, :pad_id].argmax(axis=1) if pad_id > 0 else None
        right = rows[:, pad_id + 1:].argmax(axis=1) + pad_id + 1 if pad_id + 1 < rows.shape[1] else None
        if left is None or right is None:
            tok[on_pad] = right if left is None else left
        else:
            at = np.arange(len(on_pad))
            tok[on_pad] = np.where(rows[at, right] > rows[at, left], right, left)
    tok = tok.astype(np.int64, copy=False)
    return logits[np.arange(len(tok)), tok], tok


def _call_step(step: Step, prefixes: np.ndarray, t: int, state, read: np.ndarray, pad_id: int):
    """Run ``step`` on a copy of the buffer (a step cannot change the loop's prefixes); check its
    output: ``(step(...) -> (logits, state))``, logits ``(N, step.vocab)`` of a real dtype, and in
    every row the search reads (``read (N,)``) a finite ``lse`` and a token other than pad that
    can be chosen (a logit above -inf). Returns (float64 logits with unread rows zeroed and pad
    at -inf, lse (N,), state)."""
    out, state = step_output(step(prefixes.copy(), t, state))
    n, vocab = prefixes.shape[0], step.vocab
    if np.shape(out) != (n, vocab):
        raise ValueError(f"step: expected logits of shape ({n}, {vocab}), got shape {np.shape(out)}")
    kind = np.asarray(out).dtype
    if kind.kind not in "biuf" and kind.name != "bfloat16":  # complex would lose its imaginary part
        raise TypeError(f"step: expected real logits, got dtype {kind.name}")
    logits = np.where(read[:, None], np.asarray(out, dtype=np.float64), 0.0)  # an unread row: anything
    lse = logsumexp(logits)
    logits[:, pad_id] = -np.inf  # never generated (after lse: it stays in the softmax)
    if not (np.isfinite(lse) & (logits.max(axis=-1) > -np.inf)).all():
        raise ValueError(bad_step_message(t))
    return logits, lse, state


# -- the searches ---------------------------------------------------------------------------------
def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int,
                  pad_id: int) -> GreedyResult:
    """Greedy decoding over ``step`` (a `Step`); see the module docstring for the exact algorithm."""
    batch, max_len = check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)  # Python ints
    rows = np.arange(batch)
    prefixes = np.full((batch, max_len + 1), pad_id, dtype=np.int64)  # (B, 1+T)
    prefixes[:, 0] = bos_id
    log_probs = np.zeros((batch, max_len))
    lengths = np.zeros(batch, dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    state = step.initial_state()
    for t in range(max_len):
        x, lse, state = _call_step(step, prefixes, t, state, ~finished, pad_id)  # (B, V), (B,)
        tok = _top_lowest(x, 1)[:, 0]  # on the logits: the lowest id of the maximum
        lp = x[rows, tok] - lse  # the chosen token's log-prob, afterwards
        prefixes[:, t + 1] = np.where(finished, pad_id, tok)  # a finished row takes pad, at 0
        log_probs[:, t] = np.where(finished, 0.0, lp)
        lengths += ~finished
        finished |= prefixes[:, t + 1] == eos_id
        if finished.all():
            break
    return GreedyResult(prefixes[:, 1:], log_probs, lengths)


def _merge(finished: tuple, new: tuple, k: int) -> tuple:
    """The best ``k`` of two sets of hypotheses ``(scores (B, n), prefixes (B, n, 1+T),
    step_scores (B, n, T), lengths (B, n))``, best first; ties: ``finished`` first, then index."""
    joined = [np.concatenate([a, b], axis=1) for a, b in zip(finished, new)]
    keep = _top_lowest(joined[0], k)  # (B, k)
    items = np.arange(len(keep))[:, None]
    return tuple(x[items, keep] for x in joined)


def beam_search(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
                pad_id: int, length_penalty: float = 0.0, return_all: bool = False) -> BeamResult:
    """Beam search over ``step`` (a `Step`; rows ``item * beam_size + beam``) with K alive and K
    finished hypotheses per item; see the module docstring."""
    b_, max_len, k_ = check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                      length_penalty)  # Python ints
    alpha, vocab = length_penalty, step.vocab
    per_beam = candidates_per_beam(k_, vocab)
    items = np.arange(b_)[:, None]  # (B, 1), for gathers
    prefixes = np.full((b_, k_, max_len + 1), pad_id, dtype=np.int64)  # (B, K, 1+T) alive
    prefixes[..., 0] = bos_id
    raw = np.full((b_, k_), -np.inf)
    raw[:, 0] = 0.0  # one real hypothesis: the first step has no duplicates
    step_scores = np.zeros((b_, k_, max_len))
    finished = (np.full((b_, k_), -np.inf), prefixes.copy(), step_scores.copy(),
                np.zeros((b_, k_), dtype=np.int64))  # scores, prefixes, step_scores, lengths
    bound = _length_penalty(max_len, alpha)  # the largest penalty: the best a raw score can become
    state = step.initial_state()
    for t in range(max_len):
        flat = prefixes.reshape(b_ * k_, max_len + 1)
        stopped = finished[0].min(axis=1) >= raw.max(axis=1) / bound  # (B,), spec step 6
        read = (raw > -np.inf) & ~stopped[:, None]
        logits, lse, state = _call_step(step, flat, t, state, read.reshape(-1), pad_id)
        x = logits.reshape(b_, k_, vocab)  # (B, K, V), pad at -inf
        top = _top_lowest(x, per_beam)  # (B, K, P) each beam's best tokens, by logit
        cand_lp = np.take_along_axis(x, top, axis=-1) - lse.reshape(b_, k_, 1)  # (B, K, P)
        cand_raw = (raw[..., None] + cand_lp).reshape(b_, k_ * per_beam)
        best = _top_lowest(cand_raw, 2 * k_)  # (B, 2K) positions beam * P + rank in beam
        src, tok = best // per_beam, top.reshape(b_, -1)[items, best]
        new_raw, new_lp = cand_raw[items, best], cand_lp.reshape(b_, -1)[items, best]
        eos = tok == eos_id
        grown = prefixes[items, src]  # (B, 2K, 1+T): the candidates' hypotheses
        grown[..., t + 1] = tok
        grown_scores = step_scores[items, src]
        grown_scores[..., t] = new_lp
        # EOS among the K best finishes (else -inf: nothing); the finished set keeps the best K.
        done_scores = np.where(eos[:, :k_], new_raw[:, :k_] / _length_penalty(t + 1, alpha), -np.inf)
        finished = _merge(finished, (done_scores, grown[:, :k_], grown_scores[:, :k_],
                                     np.full((b_, k_), t + 1)), k_)
        alive = np.argsort(np.arange(2 * k_) + 2 * k_ * eos, axis=-1, kind="stable")[:, :k_]
        prefixes, step_scores, raw = grown[items, alive], grown_scores[items, alive], new_raw[items, alive]
        state = step.reorder(state, (items * k_ + src[items, alive]).reshape(-1))  # (B*K,)
        if (finished[0].min(axis=1) >= raw.max(axis=1) / bound).all():  # every item stopped
            break
    length = t + 1  # every alive hypothesis's
    finished = _merge(finished, (raw / _length_penalty(length, alpha), prefixes, step_scores,
                                 np.full((b_, k_), length)), k_)
    scores, prefixes, step_scores, lengths = finished
    result = BeamResult(prefixes[:, 0, 1:], scores[:, 0], step_scores[:, 0], lengths[:, 0])
    if return_all:
        result = result._replace(all_tokens=prefixes[..., 1:], all_scores=scores, all_lengths=lengths)
    return result
