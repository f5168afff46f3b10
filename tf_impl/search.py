"""Greedy decoding and beam search over a step function in TensorFlow: `shared.decoding`, step for
step, as one ``tf.while_loop``.

The module docstring of `shared.decoding` is the specification; this is its translation to
TensorFlow, in the step's dtype, with the same names for the same state (torch_impl.search is the
other translation). Its fixed-shape loop is taken literally: the whole state is a ``NamedTuple`` of
fixed-shape tensors (``max_len`` output columns from the start), ``cond = t < T and not
all(finished)``, and one loop body serves both ways of running it:

* eagerly, where ``tf.while_loop`` is a Python loop over the same ops;
* inside ``tf.function`` (optionally ``jit_compile=True``), where it is one graph loop.

Both run the same ops on the same shapes. On the same logits every mode gives the same tokens; the
float formulas, the log-softmax (Eigen's exp and log, not NumPy's) and the length penalty, may
differ from the spec by an ulp (grappler turns ``/ 6`` into ``* (1/6)`` inside a tf.function;
TF's ``pow`` is Eigen's, not libm's).

A step is the `shared.decoding.Step` of the spec, the contract of torch_impl.search too::

    step.vocab: int, step.dtype: tf.DType     the logits' V and dtype (they size the state)
    step.initial_state() -> nested tensors    () for a stateless step
    step(prefixes, t, state) -> (logits, state)
    step.reorder(state, rows) -> state        after each beam selection

``prefixes`` is the whole buffer ``(N, 1 + T)`` int64 (BOS in column 0, the tokens chosen so far in
columns ``1 .. t``, pad after), ``t`` the int32 step; a step reads what it needs (``[:, :t+1]`` to
recompute, column ``t`` with a cache). Rows are ``n = item * beams + beam``; after a selection, row
``n`` continues from row ``rows[n]`` ``(N,)``. The output must be ``(N, V)`` logits without NaN or
+inf, and with a token other than pad above -inf, in the rows the search reads: a bad step is
recorded in the state
(``bad_step``), stops the loop and raises the spec's ``ValueError`` once the loop is back (nothing
can raise inside an XLA program; torch_impl.search raises inside its loop instead).

Each search is a loop (`greedy_loop`, `beam_loop`: tensors in, a dict of tensors out, eagerly or
inside a ``tf.function``), a conversion (`greedy_result`, `beam_result`: NumPy results, raising for
a bad step) and the two together behind the spec's argument checks (`greedy_search`,
`beam_search`), as in torch_impl.search.

Selection is on the logits and ties are broken explicitly (docs/design.md, convention 11) with
``tf.math.top_k``, documented to put the lower index first among equal values: greedy takes its
k = 1 (not ``tf.math.argmax``, whose tie order is not promised), beam search ranks each beam's
tokens by logit, then the candidates by raw score over the flat index ``beam * P + rank``.

``observe(t, top)``, when given (eager only: it is Python, called once a step), sees the best
log-probs of each step, sorted descending: ``(B, 2)`` in greedy, ``(B, 2K)`` candidate raw scores in
beam search (NaN for an item that has stopped), as in torch_impl.search. It changes nothing in the search.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from shared.decoding import (BeamResult, GreedyResult, Step, bad_step_message, candidates_per_beam,
                             check_beam_args, check_greedy_args, step_output)

Observe = Callable[[int, tf.Tensor], object]


class GreedyState(NamedTuple):
    t: tf.Tensor  # int32 ()
    prefixes: tf.Tensor  # int64 (B, 1+T)
    log_probs: tf.Tensor  # (B, T)
    lengths: tf.Tensor  # int64 (B,)
    finished: tf.Tensor  # bool (B,)
    bad_step: tf.Tensor  # int32 (): first step with a bad row, -1 if none
    step_state: object


class Hypotheses(NamedTuple):
    """K hypotheses per item, alive or finished (``scores``: raw for alive ones, ranking scores for
    finished ones; ``lengths`` only for finished ones: alive ones all have length t)."""
    scores: tf.Tensor  # (B, K)
    prefixes: tf.Tensor  # int64 (B, K, 1+T)
    step_scores: tf.Tensor  # (B, K, T)
    lengths: tf.Tensor  # int64 (B, K)


class BeamState(NamedTuple):
    t: tf.Tensor  # int32 ()
    alive: Hypotheses
    finished: Hypotheses
    bad_step: tf.Tensor  # int32 ()
    step_state: object


# -- helpers --------------------------------------------------------------------------------------
def _call_step(step: Step, prefixes: tf.Tensor, t: tf.Tensor, state, read: tf.Tensor, pad_id: int):
    """Run ``step``; its output must be ``(rows, V)`` in ``step.dtype`` (checked on the static
    shape where known, at run time otherwise). Returns (logits with unread rows zeroed and pad at
    -inf, lse (N,), invalid (bool ()), state)."""
    rows = prefixes.shape[0]  # None when the batch is known only at run time (a SavedModel)
    out, state = step_output(step(prefixes, t, state))
    is_tensor = isinstance(out, (tf.Tensor, tf.Variable))
    shape = out.shape if is_tensor else tf.TensorShape(np.shape(out))
    if not is_tensor or not shape.is_compatible_with((rows, step.vocab)):
        got = tuple(shape) if shape.rank is not None else "unknown"
        raise ValueError(f"step: expected logits of shape ({rows}, {step.vocab}), got shape {got}")
    if out.dtype != step.dtype:
        raise TypeError(f"step: expected logits of dtype {step.dtype.name}, got {out.dtype.name}")
    out = tf.ensure_shape(out, (rows, step.vocab))
    logits = tf.where(read[:, None], out, tf.zeros((), out.dtype))  # an unread row may hold anything
    lse = tf.reduce_logsumexp(logits, axis=-1)  # pad included: the model's own log-softmax
    pad = tf.range(step.vocab) == pad_id  # never generated (after lse: it stays in the softmax)
    logits = tf.where(pad, tf.constant(-np.inf, out.dtype), logits)
    # unreadable: NaN or +inf (lse), or no token but pad possible (every other logit -inf)
    unreadable = tf.logical_or(tf.logical_not(tf.math.is_finite(lse)),
                               tf.reduce_max(logits, axis=-1) == -np.inf)
    return logits, lse, tf.reduce_any(tf.logical_and(read, unreadable)), state


def _write_column(x: tf.Tensor, values: tf.Tensor, column: tf.Tensor) -> tf.Tensor:
    """``x`` with ``x[..., column] = values`` (a select: fixed shape, no scatter). ``values`` has
    ``x``'s shape without the last axis."""
    return tf.where(tf.range(x.shape[-1]) == column, values[..., None], x)


def _penalty(length, alpha: tf.Tensor) -> tf.Tensor:
    """GNMT ``((5 + L) / 6) ** alpha``, in that order, in alpha's dtype."""
    return ((5.0 + tf.cast(length, alpha.dtype)) / 6.0) ** alpha


def _check_observe(observe: Observe | None) -> None:
    if observe is not None and not tf.executing_eagerly():
        raise ValueError("observe: a Python hook called once a step, so only when the loop runs "
                         "eagerly (compiled=False), got one inside tf.function")


def _raise_bad_step(bad_step) -> None:
    if int(bad_step) >= 0:
        raise ValueError(bad_step_message(int(bad_step)))


def _run(loop: Callable[[], dict], compiled: bool, jit_compile: bool) -> dict:
    if jit_compile and not compiled:
        raise ValueError("jit_compile: XLA compiles the tf.function of the loop, so it needs "
                         "compiled=True")
    return tf.function(loop, jit_compile=jit_compile, autograph=False)() if compiled else loop()


def _numpy(outputs: dict) -> dict:
    return {name: value.numpy() for name, value in outputs.items()}


def _start_row(max_len: int, bos_id: int, pad_id: int) -> tf.Tensor:
    """``(1+T,)`` int64: the start token, then pad."""
    return tf.where(tf.range(max_len + 1) == 0, tf.constant(bos_id, tf.int64), tf.constant(pad_id, tf.int64))


# -- greedy ---------------------------------------------------------------------------------------
def greedy_loop(step: Step, batch: int, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                observe: Observe | None = None) -> dict[str, tf.Tensor]:
    """The greedy loop of `shared.decoding.greedy_search` on tensors (no argument checks: see
    `greedy_search`); runs eagerly or inside a ``tf.function``. ``batch`` is a Python int, or a
    scalar int32 tensor where the batch size is known only at run time (a SavedModel signature);
    ``max_len`` a Python int (a NumPy int8 would range in int8). Returns
    tensors ``tokens (B, T)`` int64, ``log_probs (B, T)``, ``lengths (B,)`` int64 and ``bad_step``
    int32 ()."""
    _check_observe(observe)
    dtype = step.dtype
    start = GreedyState(
        t=tf.constant(0), prefixes=tf.tile(_start_row(max_len, bos_id, pad_id)[None], [batch, 1]),
        log_probs=tf.zeros([batch, max_len], dtype), lengths=tf.zeros([batch], tf.int64),
        finished=tf.zeros([batch], tf.bool), bad_step=tf.constant(-1), step_state=step.initial_state())

    def cond(s: GreedyState):
        return tf.logical_and(s.t < max_len, tf.logical_and(tf.logical_not(tf.reduce_all(s.finished)),
                                                            s.bad_step < 0))

    def body(s: GreedyState):
        logits, lse, invalid, state = _call_step(step, s.prefixes, s.t, s.step_state,
                                                 tf.logical_not(s.finished), pad_id)  # (B, V)
        best, tok = tf.math.top_k(logits, 1)  # on the logits; ties: the lower id
        tok = tf.where(s.finished, tf.constant(pad_id, tf.int64), tf.cast(tok[:, 0], tf.int64))
        lp = tf.where(s.finished, tf.zeros((), dtype), best[:, 0] - lse)  # the log-prob, afterwards
        if observe is not None:
            observe(int(s.t), tf.math.top_k(logits, 2).values - lse[:, None])
        return (GreedyState(
            t=s.t + 1,
            prefixes=_write_column(s.prefixes, tok, s.t + 1),
            log_probs=_write_column(s.log_probs, lp, s.t),
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
                  observe: Observe | None = None, *, compiled: bool = False,
                  jit_compile: bool = False) -> GreedyResult:
    """Greedy decoding over ``step``; the algorithm of `shared.decoding.greedy_search`, with its
    argument checks (`shared.decoding.check_greedy_args`).

    Args:
        compiled: run the loop inside a ``tf.function``, traced on every call (for a compiled loop
            traced once and reused: checks, a ``tf.function`` of your own around `greedy_loop`
            given Python ints, then `greedy_result`, as `tf_impl.decoding` does); jit_compile:
            with XLA.

    Returns NumPy arrays: tokens ``(B, T)`` int64, log_probs ``(B, T)`` in the step's dtype,
    lengths ``(B,)`` int64 (T = max_len columns whatever step the loop stops at).
    """
    batch, max_len = check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id)  # Python ints
    return greedy_result(_run(lambda: greedy_loop(step, batch, max_len, bos_id, eos_id, pad_id, observe),
                              compiled, jit_compile))


# -- beam search ----------------------------------------------------------------------------------
def _merge(finished: Hypotheses, new: Hypotheses, k: int) -> Hypotheses:
    """The best ``k`` of two sets of hypotheses, best first; ties: ``finished`` first, then index
    (``tf.math.top_k``'s order)."""
    joined = [tf.concat([a, b], axis=1) for a, b in zip(finished, new)]
    keep = tf.math.top_k(joined[0], k).indices  # (B, k)
    return Hypotheses(*(tf.gather(x, keep, batch_dims=1) for x in joined))


def _stopped(s: BeamState, bound: tf.Tensor) -> tf.Tensor:
    """bool (B,): no alive hypothesis of the item can still enter its finished set (spec, step 6)."""
    best = tf.reduce_max(s.alive.scores, axis=1) / bound
    return tf.reduce_min(s.finished.scores, axis=1) >= best


def beam_loop(step: Step, batch: int, max_len: int, beam_size: int, bos_id: int, eos_id: int,
              pad_id: int, length_penalty=0.0, observe: Observe | None = None) -> dict[str, tf.Tensor]:
    """The beam loop of `shared.decoding.beam_search` on tensors, K alive and K finished hypotheses
    per item (no argument checks: see `beam_search`); runs eagerly or inside a ``tf.function``;
    ``batch`` and ``max_len`` as in `greedy_loop`, ``beam_size`` a Python int.
    ``length_penalty`` may be a Python float or a scalar tensor (so that one compiled loop serves
    every alpha: ``alpha = 0`` gives a penalty of exactly 1.0). Returns the tensors of every
    `BeamResult` field (``all_*`` included) and ``bad_step``."""
    _check_observe(observe)
    dtype, vocab = step.dtype, step.vocab
    b_, k_ = batch, beam_size
    per_beam = candidates_per_beam(k_, vocab)
    # tf.cast of a Python float would round it to float32 first
    alpha = (tf.cast(length_penalty, dtype) if isinstance(length_penalty, tf.Tensor)
             else tf.constant(length_penalty, dtype))
    bound = _penalty(max_len, alpha)  # the largest penalty: the best a raw score can become
    neg_inf = tf.constant(-np.inf, dtype)
    raw0 = tf.where(tf.range(k_) == 0, tf.zeros((), dtype), neg_inf)  # one real hypothesis
    empty = Hypotheses(tf.fill([b_, k_], neg_inf),
                       tf.tile(_start_row(max_len, bos_id, pad_id)[None, None], [b_, k_, 1]),
                       tf.zeros([b_, k_, max_len], dtype), tf.zeros([b_, k_], tf.int64))
    start = BeamState(t=tf.constant(0), alive=empty._replace(scores=tf.tile(raw0[None], [b_, 1])),
                      finished=empty, bad_step=tf.constant(-1), step_state=step.initial_state())
    first_row = tf.range(b_, dtype=tf.int64)[:, None] * k_  # (B, 1): row of each item's beam 0
    alive_key = tf.cast(tf.range(2 * k_), dtype)  # the 2K candidates' positions

    def cond(s: BeamState):
        return tf.logical_and(s.t < max_len, tf.logical_and(
            tf.logical_not(tf.reduce_all(_stopped(s, bound))), s.bad_step < 0))

    def body(s: BeamState):
        a = s.alive
        flat = tf.reshape(a.prefixes, [b_ * k_, max_len + 1])  # (B*K, 1+T)
        read = tf.logical_and(a.scores > neg_inf, tf.logical_not(_stopped(s, bound))[:, None])
        read = tf.reshape(read, [-1])  # rows of hypotheses of items not stopped
        logits, lse, invalid, state = _call_step(step, flat, s.t, s.step_state, read, pad_id)
        best_logits, top = tf.math.top_k(tf.reshape(logits, [b_, k_, vocab]), per_beam)  # (B, K, P)
        cand_lp = best_logits - tf.reshape(lse, [b_, k_, 1])
        cand_raw = tf.reshape(a.scores[..., None] + cand_lp, [b_, k_ * per_beam])
        new_raw, best = tf.math.top_k(cand_raw, 2 * k_)  # (B, 2K), positions beam * P + rank
        src = best // per_beam
        tok = tf.cast(tf.gather(tf.reshape(top, [b_, -1]), best, batch_dims=1), tf.int64)
        new_lp = tf.gather(tf.reshape(cand_lp, [b_, -1]), best, batch_dims=1)
        eos = tok == eos_id
        grown = _write_column(tf.gather(a.prefixes, src, batch_dims=1), tok, s.t + 1)  # (B, 2K, 1+T)
        grown_scores = _write_column(tf.gather(a.step_scores, src, batch_dims=1), new_lp, s.t)
        # EOS among the K best finishes (else -inf: nothing); the finished set keeps the best K.
        length = tf.cast(s.t + 1, tf.int64)
        done = tf.where(eos[:, :k_], new_raw[:, :k_] / _penalty(length, alpha), neg_inf)
        finished = _merge(s.finished, Hypotheses(done, grown[:, :k_], grown_scores[:, :k_],
                                                 tf.fill([b_, k_], length)), k_)
        # alive: the first K candidates that do not end in EOS
        alive = tf.math.top_k(-(alive_key + 2 * k_ * tf.cast(eos, dtype)), k_).indices  # (B, K)
        keep = lambda x: tf.gather(x, alive, batch_dims=1)  # noqa: E731
        if observe is not None:
            stopped = _stopped(s, bound)[:, None]  # nothing decided there: NaN
            observe(int(s.t), tf.where(stopped, tf.constant(np.nan, dtype), new_raw))
        return (BeamState(
            t=s.t + 1,
            alive=Hypotheses(keep(new_raw), keep(grown), keep(grown_scores), a.lengths),
            finished=finished,
            bad_step=tf.where(tf.logical_and(invalid, s.bad_step < 0), s.t, s.bad_step),
            step_state=step.reorder(state, tf.reshape(first_row + tf.cast(keep(src), tf.int64), [-1]))),)

    (s,) = tf.while_loop(cond, body, (start,))
    length = tf.cast(s.t, tf.int64)  # every alive hypothesis's: they join the finished set
    a = s.alive
    joined = _merge(s.finished, a._replace(scores=a.scores / _penalty(length, alpha),
                                           lengths=tf.fill([b_, k_], length)), k_)
    tokens = joined.prefixes[..., 1:]
    return {"tokens": tokens[:, 0], "scores": joined.scores[:, 0],
            "step_scores": joined.step_scores[:, 0], "lengths": joined.lengths[:, 0],
            "all_tokens": tokens, "all_scores": joined.scores, "all_lengths": joined.lengths,
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
                observe: Observe | None = None, *, compiled: bool = False,
                jit_compile: bool = False) -> BeamResult:
    """Beam search over ``step`` (rows ``item * beam_size + beam``); the algorithm of
    `shared.decoding.beam_search`, in the step's dtype, with its argument checks
    (`shared.decoding.check_beam_args`). ``compiled``, ``jit_compile``: as `greedy_search`.
    Returns NumPy arrays, shapes as `shared.decoding.BeamResult`.
    """
    batch, max_len, beam_size = check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                                length_penalty)  # Python ints
    alpha = float(length_penalty)
    return beam_result(_run(lambda: beam_loop(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                                              alpha, observe), compiled, jit_compile), return_all)
