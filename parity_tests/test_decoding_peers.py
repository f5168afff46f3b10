"""External decoders as peers of `shared.decoding`, on the same step function.

The TF Model Garden's ``sequence_beam_search`` (transcribed in `parity_tests.model_garden_search`,
with the link: ``tf-models-official`` cannot be installed alone) is the fixed-shape beam search with
K alive and K finished hypotheses the spec follows. They share: candidates = the 2K best of K * V
by raw log-prob (ties to the lower flat index), alive = the K best of those not ending in EOS, the
GNMT normalisation ``((5 + length) / 6) ** alpha`` of finished scores, the bound ``best alive /
penalty(max_len)``. They differ in three rules, each shown on a table below:

1. **finish**: the Model Garden finishes every EOS candidate of the 2K; the spec only those among
   the K best (fairseq's and Hugging Face's rule, so that beam size 1 is greedy);
2. **stop**: it stops an item once the worst finished hypothesis it *has* beats the bound,
   strictly, even with fewer than K (so some of its K slots may stay empty); the spec once the
   K-th slot (empty = -inf) is >= the bound, so all K results are the K best;
3. **end**: it returns the finished hypotheses of an item that has any, else the alive ones with
   raw scores; the spec lets the alive hypotheses join the finished set (a hypothesis still alive
   at max_len is ranked like any other, as Hugging Face and CTranslate2 do).

With those three lines switched to the spec's rules (``rules="twins"``) the transcription returns
the spec's hypotheses and scores exactly, on random tables and on a real model's step. Neither
normalises pad away: the steps here give pad a logit of -inf (the spec excludes pad itself).
"""
import numpy as np
import pytest

from parity_tests.decoding_cases import config64, sources, weights_for
from parity_tests.test_decoding_stub import (BOS, EOS, PAD, STAGGERED_TABLES, A, B, RandomStep,
                                             TableStep, V, padded)
from shared import decoding as D
from shared import reference as R
from shared.masks import make_src_mask, make_tgt_mask
from shared.tolerances import FLOAT64, assert_close

tf = pytest.importorskip("tensorflow")

from parity_tests.model_garden_search import sequence_beam_search  # noqa: E402


def no_pad(fn):
    """``fn``'s logits with pad at -inf, so that both searches normalise over the same tokens."""
    def logits(prefix):
        out = np.array(fn(prefix), dtype=np.float64)
        out[:, PAD] = -np.inf
        return out
    return logits


def model_garden(fn, batch, max_len, k, alpha, rules="model-garden", vocab=V, eos=EOS, bos=BOS):
    """The transcription on the NumPy step ``fn(prefix (N, i+1)) -> logits (N, V)``, float64."""
    def symbols_to_logits(ids, i):
        return tf.constant(fn(ids.numpy()))
    return sequence_beam_search(symbols_to_logits, tf.fill([batch], tf.constant(bos, tf.int64)),
                                vocab, k, alpha, max_len, eos, tf.float64, rules)


def spec(fn, batch, max_len, k, alpha, vocab=V, eos=EOS, bos=BOS, pad=PAD):
    return D.beam_search(D.stateless_step(fn, vocab), batch, max_len, k, bos, eos, pad, alpha, True)


def assert_same(mg, want, where: str) -> None:
    """Every hypothesis (tokens up to its length), length and score of the Model Garden's result
    equal the spec's."""
    seq, scores, lengths = mg
    np.testing.assert_array_equal(lengths, want.all_lengths, err_msg=where)
    steps = seq.shape[-1] - 1
    for b, j in np.ndindex(*lengths.shape):
        n = int(lengths[b, j])
        np.testing.assert_array_equal(seq[b, j, 1:n + 1], want.all_tokens[b, j, :n], err_msg=where)
        assert (want.all_tokens[b, j, n:] == PAD).all() and n <= steps
    assert_close(scores, want.all_scores, FLOAT64, f"scores {where}")


@pytest.mark.parametrize("k, alpha", [(1, 0.0), (2, 0.0), (3, 0.7), (4, 1.0)])
@pytest.mark.parametrize("seed", range(3))
def test_model_garden_with_the_spec_rules_equals_the_spec_on_random_tables(seed, k, alpha):
    fn = no_pad(RandomStep(seed, k).fn)
    assert_same(model_garden(fn, 3, 8, k, alpha, rules="twins"), spec(fn, 3, 8, k, alpha),
                f"seed {seed}")


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_model_garden_with_the_spec_rules_equals_the_spec_on_a_model(alpha):
    """A real model's step (the float64 oracle's decoder, random tiny weights with the EOS logit
    raised), K = 3, max_len 10: every hypothesis and score the same."""
    config = config64("tiny-post-standard")
    fn, src = model_step(config, 0)
    assert_same(model_garden(fn, len(src), 10, 3, alpha, "twins", config.tgt_vocab, config.eos_id,
                             config.start_id),
                spec(fn, len(src), 10, 3, alpha, config.tgt_vocab, config.eos_id, config.start_id,
                     config.pad_id), f"alpha {alpha}")


def model_step(config, seed, beams=3):
    model = R.Model(weights_for(config, seed), config)
    src = sources(config, seed)
    src_mask = make_src_mask(src, config.pad_id)  # (B, 1, 1, S)
    memory = np.repeat(model.encode(src, src_mask, None), beams, axis=0)
    mask = np.repeat(src_mask, beams, axis=0)

    def logits(prefix):
        hidden = model.decode(prefix, memory, mask, make_tgt_mask(prefix, config.pad_id), None)
        out = model.project(hidden[:, -1])
        out[:, config.pad_id] = -np.inf
        return out
    return logits, src


def test_model_garden_as_published_on_a_model():
    """The published rules on the same model step: the alive hypotheses evolve alike, and the
    Model Garden finishes a superset of the spec's EOS candidates (rule 1) while both run, so
    wherever the spec's best ends in EOS the Model Garden's best scores at least as high (rule 3
    lets the spec's best be a hypothesis alive at max_len, which the Model Garden may not return)."""
    config = config64("tiny-post-standard")
    for seed in range(3):
        fn, src = model_step(config, seed)
        seq, scores, lengths = model_garden(fn, len(src), 10, 3, 0.0, "model-garden",
                                            config.tgt_vocab, config.eos_id, config.start_id)
        want = spec(fn, len(src), 10, 3, 0.0, config.tgt_vocab, config.eos_id, config.start_id,
                    config.pad_id)
        ends = (want.tokens == config.eos_id).any(axis=1)
        assert (scores[ends, 0] >= want.scores[ends] - FLOAT64.rtol).all(), (seed, scores[:, 0], want.scores)
        same = [np.array_equal(seq[b, 0, 1:lengths[b, 0] + 1], want.tokens[b, :want.lengths[b]])
                for b in range(len(src))]
        print(f"seed {seed}: same best hypothesis for {sum(same)} of {len(src)} items")


def test_model_garden_as_published_where_the_rules_coincide():
    """A table where no EOS ranks K+1 .. 2K, the finished sets fill to K before the stop and
    nothing is alive at max_len: the published algorithm returns the spec's answer."""
    tables = [{(): {A: .6, B: .4}, (A,): {EOS: .4, A: .3, B: .3}, (B,): {EOS: .9, A: .05, B: .05}}]
    fn = TableStep(tables, beams=2, default={EOS: 1.0}).fn
    assert_same(model_garden(fn, 1, 4, 2, 0.0), spec(fn, 1, 4, 2, 0.0), "better than greedy")


def test_rule_finish_an_eos_below_the_k_best():
    """K = 1: EOS (p .4) ranks second at step 0. The Model Garden finishes it and returns it; the
    spec prunes it (as greedy would) and returns A B EOS."""
    tables = [{(): {A: .6, EOS: .4}, (A,): {B: .6, EOS: .4}, (A, B): {EOS: 1.0}}]
    step = TableStep(tables, beams=1, default={EOS: 1.0})
    seq, scores, _ = model_garden(step.fn, 1, 3, 1, 0.0)
    np.testing.assert_array_equal(seq[0, 0, 1:2], [EOS])
    want = spec(step.fn, 1, 3, 1, 0.0)
    np.testing.assert_array_equal(want.tokens, [[A, B, EOS]])
    assert scores[0, 0] > want.scores[0]  # log .4 > log(.6 * .6): the wider net finds more
    np.testing.assert_array_equal(D.greedy_search(D.stateless_step(step.fn, V), 1, 3, BOS, EOS, PAD).tokens,
                                  want.tokens)


def test_rule_stop_with_fewer_than_k_finished():
    """Item 0 of the staggered tables: after step 0 EOS (-0.69) beats every alive hypothesis, so
    the Model Garden stops that item with one finished hypothesis and an empty slot (its lowest
    score, -1e7); the spec goes on until two are finished (A EOS) and returns both."""
    step = TableStep(STAGGERED_TABLES[:1], beams=2, default={EOS: 1.0})
    seq, scores, _ = model_garden(step.fn, 1, 5, 2, 0.0)
    assert seq.shape[-1] == 2  # one step
    np.testing.assert_array_equal(seq[0, 0, 1:], [EOS])
    assert scores[0, 1] == -1e7  # the empty slot
    want = spec(step.fn, 1, 5, 2, 0.0)
    np.testing.assert_array_equal(want.all_tokens[0], [padded([EOS], 5), padded([A, EOS], 5)])


def test_rule_end_an_alive_hypothesis_at_max_len():
    """K = 1, max_len 2: the Model Garden finishes EOS at step 0 (second candidate, rule 1) and
    returns it, though A A, alive at max_len, scores higher; the spec returns A A."""
    tables = [{(): {A: .6, EOS: .4}, (A,): {A: .9, EOS: .1}}]
    step = TableStep(tables, beams=1, default={EOS: 1.0})
    seq, scores, _ = model_garden(step.fn, 1, 2, 1, 0.0)
    np.testing.assert_array_equal(seq[0, 0, 1:2], [EOS])
    want = spec(step.fn, 1, 2, 1, 0.0)
    np.testing.assert_array_equal(want.tokens, [[A, A]])
    assert want.scores[0] > scores[0, 0]  # log(.6 * .9) > log .4
