"""The TF Model Garden's beam search, transcribed as a peer for the decoding suite.

Source: tensorflow/models, ``official/nlp/modeling/ops/beam_search.py`` (`SequenceBeamSearch`,
`sequence_beam_search`), read at commit 00b830c7ca641413f37e5147cf059c89f79b0e8e:
https://github.com/tensorflow/models/blob/00b830c7ca641413f37e5147cf059c89f79b0e8e/official/nlp/modeling/ops/beam_search.py

Why a transcription: ``tf-models-official`` cannot be installed alone here (pip resolves it to
tf-keras, tensorflow-hub, tensorflow-datasets, tensorflow-model-optimization, kaggle, pandas and
more, and tf-keras's metadata fails to build), so its algorithm is written out below, step for step,
in its non-padded form (sequences grow by concatenation), eagerly. What it does, in its own terms:

* log-probs ``logits - reduce_logsumexp(logits)``; candidates = the top ``2K`` of ``alive log-prob +
  log-prob`` over the flat ``beam * V + token`` (``tf.nn.top_k``: ties to the lower index);
* alive = the top K of those 2K after adding ``-INF`` (a finite 1e7, its ``inf(dtype)``) to the ones
  ending in EOS;
* finished = the top K of the old finished and **every** EOS candidate of the 2K, scored
  ``log-prob / ((5 + i + 1) / 6) ** alpha`` (non-EOS ones get ``-INF`` added);
* continue while ``i < max_len`` and not, for every item, ``lowest finished score > best alive
  log-prob / ((5 + max_len) / 6) ** alpha``, where the lowest is over the finished slots that hold
  a hypothesis (empty ones count as 0, so they do not lower it), and ``-INF`` if none does;
* result: the finished sequences and scores of an item that has any, else its alive sequences and
  raw log-probs.

The three rules where `shared.decoding` differs are marked ``RULE``; ``rules="twins"`` switches
them to the spec's (EOS finishes only among the K best of the 2K; stop when the K-th finished
slot, empty = -inf, is >= the bound; the alive hypotheses join the finished set at the end), so a
test can show that these three lines are the whole difference. Adaptations, none of which changes a
result: ``inf()`` returns its float32 value 1e7 for float64 too (the original refuses float64), and
the ids are int64.
"""
from __future__ import annotations

import tensorflow as tf

INF = 1e7  # the original's inf(float32): "close to infinity" yet 0 when multiplied by 0


def _gather_beams(x, beams):
    """``x[b, beams[b, j]]`` for every item b: ``(B, n, ...)`` -> ``(B, k, ...)``."""
    return tf.gather(x, beams, batch_dims=1)


def _norm(alpha, length, dtype):
    return tf.pow((5.0 + tf.cast(length, dtype)) / 6.0, alpha)


def sequence_beam_search(symbols_to_logits_fn, initial_ids, vocab_size: int, beam_size: int,
                         alpha: float, max_decode_length: int, eos_id: int, dtype=tf.float32,
                         rules: str = "model-garden"):
    """``symbols_to_logits_fn(ids (B*K, i+1), i) -> logits (B*K, V)``; ``initial_ids (B,)``.
    Returns ``(sequences (B, K, 1 + steps), scores (B, K), lengths (B, K))``, best first (lengths:
    tokens after the initial id up to and including EOS, for comparing with `shared.decoding`)."""
    if rules not in ("model-garden", "twins"):
        raise ValueError(f"rules: expected 'model-garden' or 'twins', got {rules!r}")
    twins = rules == "twins"
    k = beam_size
    batch = int(initial_ids.shape[0])
    alive_seq = tf.tile(tf.cast(initial_ids, tf.int64)[:, None, None], [1, k, 1])  # (B, K, 1)
    first = tf.constant([[0.0] + [-float("inf")] * (k - 1)], dtype)
    alive_log_probs = tf.tile(first, [batch, 1])  # (B, K)
    finished_seq = tf.zeros_like(alive_seq)
    finished_scores = tf.fill([batch, k], tf.constant(-INF, dtype))
    finished_flags = tf.zeros([batch, k], tf.bool)
    i = 0

    def keep_going() -> bool:
        best_alive = alive_log_probs[:, 0] / _norm(alpha, max_decode_length, dtype)
        if twins:  # RULE (stop): the K-th slot, empty = -inf, >= the bound
            lowest = tf.reduce_min(tf.where(finished_flags, finished_scores, -float("inf")), axis=1)
            return i < max_decode_length and not bool(tf.reduce_all(lowest >= best_alive))
        lowest = tf.reduce_min(finished_scores * tf.cast(finished_flags, dtype), axis=1)
        lowest += (1.0 - tf.cast(tf.reduce_any(finished_flags, 1), dtype)) * -INF
        return i < max_decode_length and not bool(tf.reduce_all(lowest > best_alive))

    while keep_going():
        # grow: the top 2K of K * V candidates
        logits = tf.reshape(symbols_to_logits_fn(tf.reshape(alive_seq, [batch * k, -1]), i),
                            [batch, k, vocab_size])
        log_probs = logits - tf.reduce_logsumexp(logits, axis=2, keepdims=True)
        log_probs = tf.reshape(log_probs + alive_log_probs[..., None], [batch, k * vocab_size])
        topk_log_probs, topk_indices = tf.nn.top_k(log_probs, k=2 * k)
        topk_ids = tf.cast(topk_indices % vocab_size, tf.int64)
        topk_seq = tf.concat([_gather_beams(alive_seq, topk_indices // vocab_size),
                              topk_ids[..., None]], axis=2)  # (B, 2K, i + 2)
        new_finished = tf.equal(topk_ids, eos_id)
        # alive: the top K not ending in EOS
        _, top = tf.nn.top_k(topk_log_probs + tf.cast(new_finished, dtype) * -INF, k=k)
        new_alive_seq, new_alive_log_probs = _gather_beams(topk_seq, top), _gather_beams(topk_log_probs, top)
        # finished: the old ones and the new EOS candidates, top K by normalised score
        if twins:  # RULE (finish): EOS only among the K best of the 2K
            new_finished = tf.logical_and(new_finished, tf.range(2 * k) < k)
        scores = topk_log_probs / _norm(alpha, i + 1, dtype)
        scores += (1.0 - tf.cast(new_finished, dtype)) * -INF
        all_seq = tf.concat([tf.concat([finished_seq, tf.zeros([batch, k, 1], tf.int64)], 2), topk_seq], 1)
        all_scores = tf.concat([finished_scores, scores], 1)
        all_flags = tf.concat([finished_flags, new_finished], 1)
        _, top = tf.nn.top_k(all_scores, k=k)
        finished_seq, finished_scores, finished_flags = (_gather_beams(x, top)
                                                         for x in (all_seq, all_scores, all_flags))
        alive_seq, alive_log_probs = new_alive_seq, new_alive_log_probs
        i += 1

    if twins:  # RULE (end): the alive hypotheses join the finished set
        alive_scores = alive_log_probs / _norm(alpha, i, dtype)
        all_scores = tf.concat([tf.where(finished_flags, finished_scores, -float("inf")), alive_scores], 1)
        _, top = tf.nn.top_k(all_scores, k=k)
        seq = _gather_beams(tf.concat([finished_seq, alive_seq], 1), top)
        scores = _gather_beams(all_scores, top)
    else:
        has = tf.reduce_any(finished_flags, 1)[:, None]
        seq = tf.where(has[..., None], finished_seq, alive_seq)
        scores = tf.where(has, finished_scores, alive_log_probs)
    ends = tf.cast(tf.equal(seq[..., 1:], eos_id), tf.int32)
    lengths = tf.where(tf.reduce_any(ends > 0, -1), tf.argmax(ends, -1, output_type=tf.int32) + 1,
                       tf.shape(seq)[-1] - 1)
    return seq.numpy(), scores.numpy(), lengths.numpy()
