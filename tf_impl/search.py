"""Greedy decoding and beam search over a step function in TensorFlow: `shared.decoding`, step for
step, as one ``tf.while_loop``.

The module docstring of `shared.decoding` is the specification; this is its translation to
TensorFlow, in the step's dtype, with the same names for the same state (torch_impl.search is the
other translation). Its fixed-shape loop is taken literally: the whole state is a ``NamedTuple`` of
fixed-shape tensors (``max_len`` output columns from the start), ``cond = t < T and not
all(finished)``, and one loop body serves both ways of running it:

* eagerly, where ``tf.while_loop`` is a Python loop over the same ops;
* inside ``tf.function`` (optionally ``jit_compile=True``), where it is one graph loop.

Both run the same ops on the same shapes. The search itself is exact (sums, selections, gathers):
on the same log-probs, every mode gives the same tokens and, with alpha = 0, the same scores; the
one float formula, the length penalty, may differ by an ulp (grappler turns ``/ 6`` into
``* (1/6)`` inside a tf.function; TF's ``pow`` is Eigen's, not libm's).

A step is the `shared.decoding.Step` of the spec, the contract of torch_impl.search too::

    step.vocab: int, step.dtype: tf.DType     the log-probs' V and dtype (they size the state)
    step.initial_state() -> nested tensors    () for a stateless step
    step(prefixes, t, state) -> (log_probs, state)
    step.reorder(state, rows) -> state        after each beam selection

``prefixes`` is the whole buffer ``(N, 1 + T)`` int64 (BOS in column 0, the tokens chosen so far in
columns ``1 .. t``, pad after), ``t`` the int32 step; a step reads what it needs (``[:, :t+1]`` to
recompute, column ``t`` with a cache). Rows are ``n = item * beams + beam``; after a selection, row
``n`` continues from row ``rows[n]`` ``(N,)``. The output must be ``(N, V)`` without NaN or +inf in
live rows: a bad step is recorded in the state (``bad_step``), stops the loop and raises the spec's
``ValueError`` once the loop is back (nothing can raise inside an XLA program; torch_impl.search
raises inside its loop instead).

Each search is a loop (`greedy_loop`, `beam_loop`: tensors in, a dict of tensors out, eagerly or
inside a ``tf.function``), a conversion (`greedy_result`, `beam_result`: NumPy results, raising for
a bad step) and the two together behind the spec's argument checks (`greedy_search`,
`beam_search`), as in torch_impl.search.

Ties are broken explicitly (docs/design.md, convention 11): greedy takes the lowest id among the
maxima (not ``tf.argmax``, whose tie order is not promised); beam search keeps ``tf.math.top_k`` of
the flat index ``beam * V + token``, documented to put the lower index first among equal values.

``observe(t, top)``, when given (eager only: it is Python, called once a step), sees the best scores
of each step, sorted descending: ``(B, 2)`` log-probs in greedy, ``(B, K + 1)`` candidate ranking
scores in beam search, as in torch_impl.search. It changes nothing in the search.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from shared.decoding import BeamResult, GreedyResult, Step, check_beam_args, check_greedy_args

Observe = Callable[[int, tf.Tensor], object]


class GreedyState(NamedTuple):
    t: tf.Tensor  # int32 ()
    prefixes: tf.Tensor  # int64 (B, 1+T)
    log_probs: tf.Tensor  # (B, T)
    lengths: tf.Tensor  # int64 (B,)
    finished: tf.Tensor  # bool (B,)
    bad_step: tf.Tensor  # int32 (): first step with NaN/+inf in a live row, -1 if none
    step_state: object


class BeamState(NamedTuple):
    t: tf.Tensor  # int32 ()
    prefixes: tf.Tensor  # int64 (B, K, 1+T)
    raw: tf.Tensor  # (B, K)
    rank: tf.Tensor  # (B, K)
    lengths: tf.Tensor  # int64 (B, K)
    finished: tf.Tensor  # bool (B, K)
    step_scores: tf.Tensor  # (B, K, T)
    bad_step: tf.Tensor  # int32 ()
    step_state: object


# -- helpers --------------------------------------------------------------------------------------
def _call_step(step: Step, prefixes: tf.Tensor, t: tf.Tensor, state, rows):
    """Run ``step``; its output must be ``(rows, V)`` in ``step.dtype`` (checked on the static
    shape where known, at run time otherwise). ``rows``: an int, or a scalar tensor when the batch
    size is known only at run time (an ``input_signature`` with ``None``: a SavedModel)."""
    out, state = step(prefixes, t, state)
    rows = rows if isinstance(rows, int) else None
    is_tensor = isinstance(out, (tf.Tensor, tf.Variable))
    shape = out.shape if is_tensor else tf.TensorShape(np.shape(out))
    if not is_tensor or not shape.is_compatible_with((rows, step.vocab)):
        got = tuple(shape) if shape.rank is not None else "unknown"
        raise ValueError(f"step: expected log-probs of shape ({rows}, {step.vocab}), got shape {got}")
    if out.dtype != step.dtype:
        raise TypeError(f"step: expected log-probs of dtype {step.dtype.name}, got {out.dtype.name}")
    return tf.ensure_shape(out, (rows, step.vocab)), state


def _invalid(out: tf.Tensor, live: tf.Tensor) -> tf.Tensor:
    """bool (): a live row holds NaN or +inf."""
    bad = tf.math.logical_or(tf.math.is_nan(out), tf.equal(out, tf.constant(np.inf, out.dtype)))
    return tf.reduce_any(tf.logical_and(bad, live[:, None]))


def _frozen_row(vocab: int, pad_id: int, dtype: tf.DType) -> tf.Tensor:
    """The log-probs a finished row proposes: pad at +0, everything else impossible. ``(V,)``."""
    return tf.where(tf.range(vocab) == pad_id, tf.constant(0.0, dtype), tf.constant(-np.inf, dtype))


def _argmax_lowest(x: tf.Tensor) -> tf.Tensor:
    """Index (int64) of the maximum along the last axis, the lowest index among equal maxima."""
    v = x.shape[-1]
    ids, none = tf.range(v, dtype=tf.int64), tf.constant(v, tf.int64)
    first = tf.reduce_min(tf.where(x == tf.reduce_max(x, axis=-1, keepdims=True), ids, none), axis=-1)
    # A NaN row matches nothing; clamped so that the gathers stay in range until bad_step raises.
    return tf.minimum(first, v - 1)


def _write_column(x: tf.Tensor, values: tf.Tensor, column: tf.Tensor) -> tf.Tensor:
    """``x`` with ``x[..., column] = values`` (a select: fixed shape, no scatter). ``values`` has
    ``x``'s shape without the last axis."""
    return tf.where(tf.range(x.shape[-1]) == column, values[..., None], x)


def _running(finished: tf.Tensor, bad_step: tf.Tensor, t: tf.Tensor, max_len: int) -> tf.Tensor:
    return tf.logical_and(t < max_len, tf.logical_and(tf.logical_not(tf.reduce_all(finished)),
                                                      bad_step < 0))


def _check_observe(observe: Observe | None) -> None:
    if observe is not None and not tf.executing_eagerly():
        raise ValueError("observe: a Python hook called once a step, so only when the loop runs "
                         "eagerly (compiled=False), got one inside tf.function")


def _raise_bad_step(bad_step) -> None:
    if int(bad_step) >= 0:
        raise ValueError(f"step: expected log-probs without NaN or +inf (step {int(bad_step)})")


def _run(loop: Callable[[], dict], compiled: bool, jit_compile: bool) -> dict:
    if jit_compile and not compiled:
        raise ValueError("jit_compile: XLA compiles the tf.function of the loop, so it needs "
                         "compiled=True")
    return tf.function(loop, jit_compile=jit_compile, autograph=False)() if compiled else loop()


def _numpy(outputs: dict) -> dict:
    return {name: value.numpy() for name, value in outputs.items()}


# -- greedy ---------------------------------------------------------------------------------------
def greedy_loop(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                observe: Observe | None = None) -> dict[str, tf.Tensor]:
    """The greedy loop of `shared.decoding.greedy_search` on tensors (no argument checks: see
    `greedy_search`); runs eagerly or inside a ``tf.function``. ``batch`` is an int, or a scalar
    int32 tensor where the batch size is known only at run time (a SavedModel signature). Returns
    tensors ``tokens (B, T)`` int64, ``log_probs (B, T)``, ``lengths (B,)`` int64 and ``bad_step``
    int32 ()."""
    _check_observe(observe)
    dtype, vocab = step.dtype, step.vocab
    frozen = _frozen_row(vocab, pad_id, dtype)
    pad_column = tf.range(vocab) == pad_id  # (V,)
    row0 = tf.where(tf.range(max_len + 1) == 0, tf.constant(bos_id, tf.int64), tf.constant(pad_id, tf.int64))
    start = GreedyState(
        t=tf.constant(0), prefixes=tf.tile(row0[None], [batch, 1]),  # (B, 1+T): BOS, then pad
        log_probs=tf.zeros([batch, max_len], dtype), lengths=tf.zeros([batch], tf.int64),
        finished=tf.zeros([batch], tf.bool), bad_step=tf.constant(-1), step_state=step.initial_state())

    def cond(s: GreedyState):
        return _running(s.finished, s.bad_step, s.t, max_len)

    def body(s: GreedyState):
        out, state = _call_step(step, s.prefixes, s.t, s.step_state, batch)  # (B, V)
        invalid = _invalid(out, tf.logical_not(s.finished))
        lp = tf.where(pad_column, tf.constant(-np.inf, dtype), out)
        lp = tf.where(s.finished[:, None], frozen, lp)  # a finished row can only take pad, at +0
        tok = _argmax_lowest(lp)  # (B,) int64
        if observe is not None:
            observe(int(s.t), tf.math.top_k(lp, 2).values)
        return (GreedyState(
            t=s.t + 1,
            prefixes=_write_column(s.prefixes, tok, s.t + 1),
            log_probs=_write_column(s.log_probs, tf.gather(lp, tok, batch_dims=1), s.t),
            lengths=s.lengths + tf.cast(tf.logical_not(s.finished), tf.int64),
            finished=tf.logical_or(s.finished, tok == eos_id),
            bad_step=tf.where(tf.logical_and(invalid, s.bad_step < 0), s.t, s.bad_step),
            step_state=state),)

    (s,) = tf.while_loop(cond, body, (start,))
    return {"tokens": s.prefixes[:, 1:], "log_probs": s.log_probs, "lengths": s.lengths,
            "bad_step": s.bad_step}


def greedy_result(outputs: dict) -> GreedyResult:
    """`greedy_loop`'s tensors as the NumPy `GreedyResult` (raising for a bad step output)."""
    out = _numpy(outputs)
    _raise_bad_step(out["bad_step"])
    return GreedyResult(out["tokens"], out["log_probs"], out["lengths"])


def greedy_search(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                  compiled: bool = False, jit_compile: bool = False,
                  observe: Observe | None = None) -> GreedyResult:
    """Greedy decoding over ``step``; the algorithm of `shared.decoding.greedy_search`, with its
    argument checks (`shared.decoding.check_greedy_args`).

    Args:
        compiled: run the loop inside a ``tf.function``, traced on every call (for a compiled loop
            traced once and reused: checks, a ``tf.function`` of your own around `greedy_loop`,
            then `greedy_result`, as `tf_impl.decoding` does); jit_compile: with XLA.

    Returns NumPy arrays: tokens ``(B, T)`` int64, log_probs ``(B, T)`` in the step's dtype,
    lengths ``(B,)`` int64 (T = max_len columns whatever step the loop stops at).
    """
    check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)
    return greedy_result(_run(lambda: greedy_loop(step, batch, max_len, bos_id, eos_id, pad_id, observe),
                              compiled, jit_compile))


# -- beam search ----------------------------------------------------------------------------------
def beam_loop(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
              pad_id: int, length_penalty=0.0, observe: Observe | None = None) -> dict[str, tf.Tensor]:
    """The beam loop of `shared.decoding.beam_search` on tensors (no argument checks: see
    `beam_search`); runs eagerly or inside a ``tf.function``; ``batch`` as in `greedy_loop`.
    ``length_penalty`` may be a Python
    float or a scalar tensor (so that one compiled loop serves every alpha: ``alpha = 0`` gives a
    penalty of exactly 1.0, and dividing by it changes nothing). Returns the tensors of every
    `BeamResult` field (``all_*`` included) and ``bad_step``."""
    _check_observe(observe)
    dtype, vocab = step.dtype, step.vocab
    b_, k_ = batch, beam_size
    frozen = _frozen_row(vocab, pad_id, dtype)
    pad_column = tf.range(vocab) == pad_id  # (V,)
    # tf.cast of a Python float would round it to float32 first
    alpha = (tf.cast(length_penalty, dtype) if isinstance(length_penalty, tf.Tensor)
             else tf.constant(length_penalty, dtype))
    row0 = tf.where(tf.range(max_len + 1) == 0, tf.constant(bos_id, tf.int64), tf.constant(pad_id, tf.int64))
    raw0 = tf.where(tf.range(k_) == 0, tf.constant(0.0, dtype), tf.constant(-np.inf, dtype))
    raw0 = tf.tile(raw0[None], [b_, 1])  # (B, K): one live beam, so the first step has no duplicates
    start = BeamState(
        t=tf.constant(0), prefixes=tf.tile(row0[None, None], [b_, k_, 1]),  # (B, K, 1+T)
        raw=raw0, rank=raw0, lengths=tf.zeros([b_, k_], tf.int64), finished=tf.zeros([b_, k_], tf.bool),
        step_scores=tf.zeros([b_, k_, max_len], dtype), bad_step=tf.constant(-1),
        step_state=step.initial_state())
    first_row = tf.range(b_, dtype=tf.int64)[:, None] * k_  # (B, 1): row of each item's beam 0

    def cond(s: BeamState):
        return _running(s.finished, s.bad_step, s.t, max_len)

    def body(s: BeamState):
        flat_prefixes = tf.reshape(s.prefixes, [b_ * k_, max_len + 1])  # (B*K, 1+T)
        out, state = _call_step(step, flat_prefixes, s.t, s.step_state, b_ * k_)  # (B*K, V)
        invalid = _invalid(out, tf.reshape(tf.logical_not(s.finished), [-1]))
        lp = tf.where(pad_column, tf.constant(-np.inf, dtype), tf.reshape(out, [b_, k_, vocab]))
        lp = tf.where(s.finished[..., None], frozen, lp)  # a finished beam proposes only itself + pad
        cand_raw = s.raw[..., None] + lp  # (B, K, V)
        cand_len = s.lengths + tf.cast(tf.logical_not(s.finished), tf.int64)  # (B, K)
        # GNMT ((5 + L) / 6) ** alpha, in that order, in the score dtype
        penalty = ((5.0 + tf.cast(cand_len, dtype)) / 6.0) ** alpha
        cand_rank = tf.reshape(cand_raw / penalty[..., None], [b_, k_ * vocab])  # (B, K*V)
        if observe is not None:
            observe(int(s.t), tf.math.top_k(cand_rank, k_ + 1).values)
        rank, order = tf.math.top_k(cand_rank, k_)  # (B, K), flat beam * V + token, ties: lower first
        order = tf.cast(order, tf.int64)
        src_beam, tok = order // vocab, order % vocab
        step_scores = tf.gather(s.step_scores, src_beam, batch_dims=1)
        chosen = tf.gather(tf.reshape(lp, [b_, k_ * vocab]), order, batch_dims=1)  # lp[src_beam, tok]
        return (BeamState(
            t=s.t + 1,
            prefixes=_write_column(tf.gather(s.prefixes, src_beam, batch_dims=1), tok, s.t + 1),
            raw=tf.gather(tf.reshape(cand_raw, [b_, k_ * vocab]), order, batch_dims=1),
            rank=rank,
            lengths=tf.gather(cand_len, src_beam, batch_dims=1),
            finished=tf.logical_or(tf.gather(s.finished, src_beam, batch_dims=1), tok == eos_id),
            step_scores=_write_column(step_scores, chosen, s.t),
            bad_step=tf.where(tf.logical_and(invalid, s.bad_step < 0), s.t, s.bad_step),
            step_state=step.reorder(state, tf.reshape(first_row + src_beam, [-1]))),)  # (B*K,)

    (s,) = tf.while_loop(cond, body, (start,))
    best = _argmax_lowest(s.rank)  # always 0: the beams are kept in ranking order
    tokens = s.prefixes[..., 1:]
    return {"tokens": tf.gather(tokens, best, batch_dims=1),
            "scores": tf.gather(s.rank, best, batch_dims=1),
            "step_scores": tf.gather(s.step_scores, best, batch_dims=1),
            "lengths": tf.gather(s.lengths, best, batch_dims=1),
            "all_tokens": tokens, "all_scores": s.rank, "all_lengths": s.lengths,
            "bad_step": s.bad_step}


def beam_result(outputs: dict, return_all: bool) -> BeamResult:
    """`beam_loop`'s tensors as the NumPy `BeamResult` (raising for a bad step output)."""
    out = _numpy(outputs)
    _raise_bad_step(out["bad_step"])
    result = BeamResult(out["tokens"], out["scores"], out["step_scores"], out["lengths"])
    if return_all:
        result = result._replace(all_tokens=out["all_tokens"], all_scores=out["all_scores"],
                                 all_lengths=out["all_lengths"])
    return result


def beam_search(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
                pad_id: int, length_penalty: float = 0.0, return_all: bool = False,
                compiled: bool = False, jit_compile: bool = False,
                observe: Observe | None = None) -> BeamResult:
    """Beam search over ``step`` (rows ``item * beam_size + beam``); the algorithm of
    `shared.decoding.beam_search`, in the step's dtype, with its argument checks
    (`shared.decoding.check_beam_args`). ``compiled``, ``jit_compile``: as `greedy_search`.
    Returns NumPy arrays, shapes as `shared.decoding.BeamResult`.
    """
    check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id, length_penalty)
    alpha = float(length_penalty)
    return beam_result(_run(lambda: beam_loop(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                              alpha, observe), compiled, jit_compile), return_all)
