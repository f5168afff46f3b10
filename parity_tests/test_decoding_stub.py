"""The search logic of `shared.decoding`, tested apart from any network (as fairseq's
``test_sequence_generator`` does): the step reads fixed tables of next-token probabilities, and
every expected token and score is worked out here by hand from those tables.

Every test that runs a search takes the ``search_backend`` fixture (`parity_tests.decoding_backends`):
the same tables and the same hand-derived answers for the NumPy spec, the torch loops and the TF
loops, eagerly and inside ``tf.function`` (XLA where the step is written in TF ops: the markov
tables). The tables are NumPy steps of the one `shared.decoding.Step` contract; each backend adapts
them to its tensors."""
import re

import numpy as np
import pytest

from parity_tests.decoding_backends import (NATIVE_SEARCH_BACKENDS, SEARCH_BACKENDS, MarkovStep,  # noqa: F401
                                            SearchBackend, installed_search_backends, search_backend)
from shared import decoding as D
from shared.decoding import StatelessStep, length_penalty, stateless_step
from shared.tolerances import SEARCH_FLOAT64, assert_close

PAD, BOS, EOS, A, B, C = range(6)
V = 6


class TableStep(StatelessStep):
    """A step from tables: ``tables[item][generated tokens] = {token: probability}``; it returns
    the log-probabilities as its logits (the search takes their log-softmax, which changes them by
    an ulp at most).

    Tokens missing from an entry have probability 0 (logit -inf). Rows whose prefix holds EOS, and
    prefixes missing from the tables, get ``finished_row`` and ``default`` (NaN unless given):
    the search must never read such a row (NaN in a row it reads is refused), so the tables list
    every prefix it may extend; ``default`` (a ``{token: probability}``) stands for every prefix
    not listed where a test does not care what follows.
    """

    def __init__(self, tables, beams=1, finished_row=np.nan, default=None):
        super().__init__(self.table_logits, V, np.float64)
        self.tables, self.beams, self.finished_row, self.default = tables, beams, finished_row, default
        self.calls = 0

    def logits(self, item, prefix) -> np.ndarray:
        entry = self.tables[item].get(tuple(prefix), self.default)
        if entry is None:
            return np.full(V, np.nan)
        probs = np.zeros(V)
        for token, p in entry.items():
            probs[token] = p
        with np.errstate(divide="ignore"):
            return np.log(probs)  # (V,)

    def lp(self, item, prefix, token) -> float:
        """The log-prob the search computes for ``token`` after ``prefix`` (the log-softmax of the
        table's logits, `shared.decoding.logsumexp`): what the expected sums are made of."""
        x = self.logits(item, prefix)
        return float(x[token] - D.logsumexp(x))

    def table_logits(self, prefixes: np.ndarray) -> np.ndarray:  # (N, t+1) -> (N, V)
        self.calls += 1
        assert prefixes.dtype == np.int64 and (prefixes[:, 0] == BOS).all()
        out = np.empty((len(prefixes), V))
        for n, row in enumerate(prefixes):
            generated = tuple(int(x) for x in row[1:])
            out[n] = self.finished_row if EOS in generated else self.logits(n // self.beams, generated)
        return out


def run_greedy(backend: SearchBackend, tables, max_len):
    step = TableStep(tables)
    return backend.greedy_search(step, len(tables), max_len, BOS, EOS, PAD), step


def run_beam(backend: SearchBackend, tables, max_len, beam_size, alpha=0.0, default=None):
    step = TableStep(tables, beams=beam_size, default=default)
    result = backend.beam_search(step, len(tables), max_len, beam_size, BOS, EOS, PAD, alpha,
                                 return_all=True)
    return result, step


def assert_scores(got, want) -> None:
    """Scores and log-probs: each implementation takes the log-softmax with its own exp and log,
    so they agree with the hand-derived values (NumPy's) to a few ulps (SEARCH_FLOAT64)."""
    assert_close(got, np.asarray(want, dtype=float), SEARCH_FLOAT64, "scores")


def padded(tokens, max_len):
    return list(tokens) + [PAD] * (max_len - len(tokens))


def path_log_probs(step, item, tokens):
    """The table's log-probs along ``tokens``, one per step."""
    return [step.lp(item, tokens[:i], tok) for i, tok in enumerate(tokens)]


# -- greedy ---------------------------------------------------------------------------------------
def test_greedy_items_stop_at_their_own_eos(search_backend):
    tables = [
        {(): {A: .6, B: .3, EOS: .1}, (A,): {EOS: .7, B: .2, A: .1}},
        {(): {B: .5, A: .4, EOS: .1}, (B,): {B: .6, EOS: .4}, (B, B): {A: .5, EOS: .3, B: .2},
         (B, B, A): {EOS: .9, A: .1}},
    ]
    result, step = run_greedy(search_backend, tables, max_len=5)
    np.testing.assert_array_equal(result.tokens, [padded([A, EOS], 5), padded([B, B, A, EOS], 5)])
    np.testing.assert_array_equal(result.lengths, [2, 4])
    want = [padded(path_log_probs(step, 0, [A, EOS]), 5), padded(path_log_probs(step, 1, [B, B, A, EOS]), 5)]
    assert_scores(result.log_probs, np.array(want, dtype=float))
    assert result.tokens.dtype == np.int64 and result.tokens.shape == (2, 5)
    assert step.calls == 4  # stops after the step where the last item finished


def test_greedy_never_generates_pad_and_breaks_ties_to_lowest_id(search_backend):
    tables = [{(): {PAD: .4, B: .25, A: .25, EOS: .1},  # pad is likeliest; A and B tie -> A
               (A,): {C: .45, B: .45, EOS: .1},          # B and C tie -> B
               (A, B): {A: .5, EOS: .5}}]                # EOS (2) and A (3) tie -> EOS
    result, step = run_greedy(search_backend, tables, max_len=4)
    np.testing.assert_array_equal(result.tokens, [[A, B, EOS, PAD]])
    assert_scores(result.log_probs, [padded(path_log_probs(step, 0, [A, B, EOS]), 4)])


@pytest.mark.parametrize("pad", [A, C], ids=["pad-inside", "pad-last"])
def test_greedy_skips_pad_anywhere_and_breaks_a_tie_across_it_to_the_lower_id(search_backend, pad):
    """Pad inside the vocabulary or last (token 0, PAD elsewhere, is an ordinary token here): the
    likeliest token is still never generated, and two tokens tied on either side of it go to the
    lower id."""
    others = [tok for tok in (PAD, A, B, C) if tok != pad]
    low, high = others[0], others[-1]  # low < pad < high, or low < high < pad
    tables = [{(): {pad: .4, low: .25, high: .25, EOS: .1}, (low,): {pad: .8, high: .15, EOS: .05},
               (low, high): {EOS: 1.0}}]
    step = TableStep(tables)
    result = search_backend.greedy_search(step, 1, 3, BOS, EOS, pad)
    np.testing.assert_array_equal(result.tokens, [[low, high, EOS]])
    assert_scores(result.log_probs, [path_log_probs(step, 0, [low, high, EOS])])


def test_greedy_max_len_without_eos(search_backend):
    tables = [{(): {A: .9, EOS: .1}, (A,): {B: .8, EOS: .2}, (A, B): {A: .7, EOS: .3}}]
    result, step = run_greedy(search_backend, tables, max_len=3)
    np.testing.assert_array_equal(result.tokens, [[A, B, A]])
    np.testing.assert_array_equal(result.lengths, [3])
    assert_scores(result.log_probs, [path_log_probs(step, 0, [A, B, A])])


# -- beam search ----------------------------------------------------------------------------------
def test_beam_finds_a_better_hypothesis_than_greedy(search_backend):
    tables = [{(): {A: .6, B: .4}, (A,): {EOS: .4, A: .3, B: .3}, (B,): {EOS: .9, A: .05, B: .05}}]
    greedy, _ = run_greedy(search_backend, tables, max_len=4)
    np.testing.assert_array_equal(greedy.tokens, [[A, EOS, PAD, PAD]])
    result, step = run_beam(search_backend, tables, max_len=4, beam_size=2)
    b_eos = step.lp(0, (), B) + step.lp(0, (B,), EOS)  # log .4 + log .9 = -1.02
    a_eos = step.lp(0, (), A) + step.lp(0, (A,), EOS)  # log .6 + log .4 = -1.43
    np.testing.assert_array_equal(result.tokens, [[B, EOS, PAD, PAD]])
    assert_scores(result.scores, [b_eos])
    assert_scores(result.step_scores, [padded(path_log_probs(step, 0, [B, EOS]), 4)])
    np.testing.assert_array_equal(result.lengths, [2])
    np.testing.assert_array_equal(result.all_tokens, [[padded([B, EOS], 4), padded([A, EOS], 4)]])
    assert_scores(result.all_scores, [[b_eos, a_eos]])
    np.testing.assert_array_equal(result.all_lengths, [[2, 2]])
    assert step.calls == 2


# A short hypothesis (EOS at once, p = .35) against a long one (A x 6 then EOS, 7 tokens).
LONG = [A] * 6 + [EOS]
PENALTY_TABLES = [{(): {A: .6, EOS: .35, B: .05},
                   **{(A,) * k: {A: .85, EOS: .10, B: .05} for k in range(1, 6)},
                   (A,) * 6: {EOS: .75, A: .25}}]


def test_length_penalty_off_prefers_the_short_hypothesis(search_backend):
    """The alive set keeps the A chain and a B branch (which ends at once, by the default row);
    EOS, A EOS, A A EOS ... finish on the way. After step 6, A^6 EOS (-1.61) and EOS (-1.05) are
    finished and the best alive (A^7, -2.71) cannot beat them: the search stops (7 calls)."""
    result, step = run_beam(search_backend, PENALTY_TABLES, max_len=8, beam_size=2, alpha=0.0,
                            default={EOS: 1.0})
    short = step.lp(0, (), EOS)                     # log .35 = -1.05
    long = sum(path_log_probs(step, 0, LONG))       # log .6 + 5 log .85 + log .75 = -1.61
    np.testing.assert_array_equal(result.tokens, [padded([EOS], 8)])
    assert_scores(result.scores, [short])
    np.testing.assert_array_equal(result.all_tokens, [[padded([EOS], 8), padded(LONG, 8)]])
    assert_scores(result.all_scores, [[short, long]])
    np.testing.assert_array_equal(result.all_lengths, [[1, 7]])
    assert step.calls == 7


def test_length_penalty_changes_the_winner(search_backend):
    result, step = run_beam(search_backend, PENALTY_TABLES, max_len=8, beam_size=2, alpha=1.0,
                            default={EOS: 1.0})
    short = step.lp(0, (), EOS) / ((5 + 1) / 6) ** 1.0     # penalty 1: -1.05
    long = sum(path_log_probs(step, 0, LONG)) / ((5 + 7) / 6) ** 1.0  # penalty 2: -0.81 wins
    np.testing.assert_array_equal(result.tokens, [padded(LONG, 8)])
    assert_scores(result.scores, [long])
    assert_scores(result.step_scores, [padded(path_log_probs(step, 0, LONG), 8)])
    np.testing.assert_array_equal(result.lengths, [7])
    np.testing.assert_array_equal(result.all_tokens, [[padded(LONG, 8), padded([EOS], 8)]])
    assert_scores(result.all_scores, [[long, short]])
    np.testing.assert_array_equal(result.all_lengths, [[7, 1]])
    assert step.calls == 7  # then the best alive, A^7 (-2.71 / penalty(8) = -1.25), cannot win


STAGGERED_TABLES = [
    # item 0: EOS at step 0, A EOS at step 1; then the best alive (A A, -2.12) cannot beat A EOS
    # (-1.72): stopped after step 1, its rows no longer read.
    {(): {EOS: .5, A: .3, B: .2}, (A,): {EOS: .6, A: .4}, (B,): {EOS: .5, A: .5}},
    # item 1: B EOS at step 1, A A EOS at step 2; stopped after step 2.
    {(): {A: .5, B: .4, EOS: .1}, (A,): {A: .9, EOS: .1}, (B,): {EOS: .8, A: .2},
     (A, A): {EOS: .7, A: .3}, (B, A): {EOS: 1.0}},
]


def test_eos_at_different_steps_for_beams_and_items(search_backend):
    result, step = run_beam(search_backend, STAGGERED_TABLES, max_len=5, beam_size=2)
    s0 = [step.lp(0, (), EOS), step.lp(0, (), A) + step.lp(0, (A,), EOS)]
    s1 = [step.lp(1, (), B) + step.lp(1, (B,), EOS),  # log .4 + log .8 = -1.139
          step.lp(1, (), A) + step.lp(1, (A,), A) + step.lp(1, (A, A), EOS)]  # -1.155
    np.testing.assert_array_equal(result.tokens, [padded([EOS], 5), padded([B, EOS], 5)])
    assert_scores(result.scores, [s0[0], s1[0]])
    np.testing.assert_array_equal(result.lengths, [1, 2])
    np.testing.assert_array_equal(result.all_tokens, [
        [padded([EOS], 5), padded([A, EOS], 5)], [padded([B, EOS], 5), padded([A, A, EOS], 5)]])
    assert_scores(result.all_scores, [s0, s1])
    np.testing.assert_array_equal(result.all_lengths, [[1, 2], [2, 3]])
    assert_scores(result.step_scores, [
        padded(path_log_probs(step, 0, [EOS]), 5), padded(path_log_probs(step, 1, [B, EOS]), 5)])
    assert step.calls == 3


def test_finished_items_are_frozen_while_others_run(search_backend):
    """Item 0 finishes a step before item 1; decoding each alone gives the same answers, so the
    extra step leaves a finished item's state unchanged (as a fixed-length loop requires)."""
    together, _ = run_beam(search_backend, STAGGERED_TABLES, max_len=5, beam_size=2)
    for item in range(2):
        alone, _ = run_beam(search_backend, STAGGERED_TABLES[item:item + 1], max_len=5, beam_size=2)
        for got, want in zip(alone, together):
            np.testing.assert_array_equal(got[0], want[item])


def test_exact_ties_go_to_lowest_token_then_lowest_beam(search_backend):
    tables = [{(): {A: .3, B: .3, C: .3, EOS: .1},  # A, B, C tie: keep A, B (C has the highest id)
               (A,): {C: .5, EOS: .5},              # step 1: four candidates with one raw score,
               (B,): {A: .5, EOS: .5},              # in order A>EOS, A>C, B>EOS, B>A: A EOS finishes
               (A, C): {EOS: 1.0},                  # step 2: A C EOS and B A EOS tie A EOS, which
               (B, A): {EOS: 1.0}}]                 # finished first and stays first
    result, step = run_beam(search_backend, tables, max_len=3, beam_size=2)
    tie = step.lp(0, (), A) + step.lp(0, (A,), EOS)
    assert tie == step.lp(0, (), B) + step.lp(0, (B,), A)  # really a tie, bit for bit
    np.testing.assert_array_equal(result.all_tokens, [[[A, EOS, PAD], [A, C, EOS]]])
    assert_scores(result.all_scores, [[tie, tie]])  # + log 1 = + 0
    np.testing.assert_array_equal(result.all_lengths, [[2, 3]])
    np.testing.assert_array_equal(result.tokens, [[A, EOS, PAD]])  # lower beam wins the tie


def test_many_exact_ties_keep_flat_index_order(search_backend):
    """A uniform table: every step is one big tie (24 candidates, more than a sort's small-input
    path), so only a stable descending order by flat index gives this answer."""
    uniform = {EOS: .25, A: .25, B: .25, C: .25}
    tables = [{prefix: uniform for prefix in [(), (A,), (B,), (C,), (A, A), (A, B), (A, C), (B, A)]}] * 2
    result, step = run_beam(search_backend, tables, max_len=3, beam_size=4)
    q = step.lp(0, (), A)  # log .25
    want = [[EOS, PAD, PAD], [A, EOS, PAD], [A, A, EOS], [A, A, A]]
    np.testing.assert_array_equal(result.all_tokens, [want, want])
    assert_scores(result.all_scores, [[q, q + q, q + q + q, q + q + q]] * 2)
    np.testing.assert_array_equal(result.all_lengths, [[1, 2, 3, 3]] * 2)


def test_beam_max_len_reached_without_eos(search_backend):
    tables = [{(): {A: .6, B: .3, EOS: .1}, (A,): {B: .7, A: .2, EOS: .1}, (B,): {A: .8, B: .1, EOS: .1}}]
    result, step = run_beam(search_backend, tables, max_len=2, beam_size=2)
    ab = step.lp(0, (), A) + step.lp(0, (A,), B)  # -0.87
    ba = step.lp(0, (), B) + step.lp(0, (B,), A)  # -1.43
    np.testing.assert_array_equal(result.all_tokens, [[[A, B], [B, A]]])
    assert_scores(result.all_scores, [[ab, ba]])
    np.testing.assert_array_equal(result.all_lengths, [[2, 2]])
    assert_scores(result.step_scores, [path_log_probs(step, 0, [A, B])])
    greedy, _ = run_greedy(search_backend, tables, max_len=2)
    np.testing.assert_array_equal(greedy.tokens, result.tokens)


def test_a_finished_hypothesis_is_never_lost(search_backend):
    """The old spec kept finished beams frozen inside the K beams: here EOS (p .30) ranks second
    at step 0, then A's two children (.31 each) push it out, and the result was A A A (.155), a
    hypothesis still live at max_len that scores below EOS. Now EOS goes to the finished set at
    step 0 and stays there: the result is EOS, then the best live hypothesis."""
    half = {A: .5, B: .5}
    tables = [{(): {A: .62, EOS: .30, B: .08}, (A,): half, (B,): half, (A, A): half, (A, B): half}]
    result, step = run_beam(search_backend, tables, max_len=3, beam_size=2)
    eos = step.lp(0, (), EOS)
    aaa = sum(path_log_probs(step, 0, [A, A, A]))
    assert eos > aaa  # log .30 = -1.20 > log(.62 * .5 * .5) = -1.86
    np.testing.assert_array_equal(result.all_tokens, [[padded([EOS], 3), [A, A, A]]])
    assert_scores(result.all_scores, [[eos, aaa]])
    np.testing.assert_array_equal(result.all_lengths, [[1, 3]])
    assert step.calls == 3  # EOS alone cannot stop the search: the finished set holds K = 2


def test_an_eos_below_the_k_best_is_pruned():
    """An EOS candidate ranked K+1 .. 2K is pruned like any candidate below the K best (fairseq's
    and Hugging Face's rule, which keeps beam size 1 greedy; the TF Model Garden keeps it):
    K = 1, EOS second at step 0 (p .4 < .6), and A's path ends lower (-1.02 - 0.69 < -0.92)."""
    tables = [{(): {A: .6, EOS: .4}, (A,): {B: .6, EOS: .4}, (A, B): {EOS: 1.0}}]
    for backend in installed_search_backends():
        result, step = run_beam(backend, tables, max_len=3, beam_size=1)
        np.testing.assert_array_equal(result.tokens, [[A, B, EOS]])
        assert sum(path_log_probs(step, 0, [A, B, EOS])) < step.lp(0, (), EOS)


class NearTieStep(StatelessStep):
    """float32 logits where A's and B's log-probs round equal but their logits do not: B's logit
    is the next float32 above A's, and pad's (8, never chosen) puts both log-probs near -7, where
    float32 values are 4.8e-7 apart. Every row, every step."""

    def __init__(self, dtype=np.float32):
        row = np.full(V, -np.inf, dtype=dtype)
        row[PAD], row[A], row[B], row[EOS] = 8.0, 1.0, np.nextafter(np.float32(1.0), np.float32(2)), -2.0
        self.row = row
        super().__init__(lambda p: np.repeat(row[None], len(p), 0), V, dtype)


def test_selection_is_on_the_logits_not_on_float32_log_probs(search_backend):
    """float32 log-softmax makes A and B tie (selection on log-probs would take A, the lower id);
    on the logits B is higher, and every implementation takes B, in greedy and in the beam."""
    step = NearTieStep()
    row = step.row
    lse = np.float32(D.logsumexp(row.astype(np.float64)))
    assert row[B] > row[A] and row[A] - lse == row[B] - lse  # the float32 log-probs tie
    greedy = search_backend.greedy_search(step, 1, 2, BOS, EOS, PAD)
    np.testing.assert_array_equal(greedy.tokens, [[B, B]])
    beam = search_backend.beam_search(NearTieStep(), 1, 2, 2, BOS, EOS, PAD, 0.0, True)
    np.testing.assert_array_equal(beam.all_tokens, [[[B, B], [B, A]]])


def test_return_all_is_off_by_default(search_backend):
    step = TableStep(STAGGERED_TABLES, beams=2)
    result = search_backend.beam_search(step, 2, 5, 2, BOS, EOS, PAD)
    assert result.all_tokens is None and result.all_scores is None and result.all_lengths is None


# -- properties on random tables ------------------------------------------------------------------
class RandomStep(StatelessStep):
    """Next-token probabilities drawn from a generator seeded by (seed, item, prefix): a fixed,
    prefix-dependent table without writing it out. EOS grows likelier with the prefix length."""

    def __init__(self, seed, beams, dtype=np.float64):
        super().__init__(self.random_log_probs, V, dtype)
        self.seed, self.beams = seed, beams

    def random_log_probs(self, prefixes):  # (N, t+1) -> (N, V)
        out = np.empty((len(prefixes), V))
        for n, row in enumerate(prefixes):
            rng = np.random.default_rng([self.seed, n // self.beams, *row.tolist()])
            probs = rng.dirichlet(np.full(V, 0.7))
            probs[EOS] += 0.08 * len(row)
            out[n] = np.log(probs / probs.sum())
        return out.astype(self.dtype)


@pytest.mark.parametrize("seed", range(6))
def test_beam_size_one_equals_greedy(search_backend, seed):
    """alpha = 0: the one alive hypothesis takes greedy's token, and an EOS finishes only as the
    best candidate, after which nothing alive can beat it."""
    greedy = search_backend.greedy_search(RandomStep(seed, 1), 3, 9, BOS, EOS, PAD)
    beam = search_backend.beam_search(RandomStep(seed, 1), 3, 9, 1, BOS, EOS, PAD, 0.0)
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_array_equal(beam.lengths, greedy.lengths)
    assert_scores(beam.step_scores, greedy.log_probs)
    raw = np.array([sum(row) for row in greedy.log_probs.tolist()])  # left to right, as accumulated
    assert_scores(beam.scores, raw)


@pytest.mark.parametrize("integer", [np.uint64, np.int8])
def test_sizes_as_numpy_ints_of_any_width_search_as_python_ints(search_backend, integer):
    """A uint64 beam size met the search's int64 indices in float64 (NumPy: "arrays used as
    indices must be of integer (or boolean) type"); an int8 one computed its candidates in int8,
    which wraps past 127. Batch, max_len and beam size of any NumPy int search as Python ints."""
    want = search_backend.beam_search(RandomStep(3, 3), 2, 9, 3, BOS, EOS, PAD, 0.6)
    got = search_backend.beam_search(RandomStep(3, 3), integer(2), integer(9), integer(3), BOS, EOS, PAD, 0.6)
    for field in ("tokens", "scores", "step_scores", "lengths"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    greedy = search_backend.greedy_search(RandomStep(3, 1), integer(2), integer(9), BOS, EOS, PAD)
    np.testing.assert_array_equal(greedy.tokens, search_backend.greedy_search(RandomStep(3, 1), 2, 9, BOS, EOS,
                                                                              PAD).tokens)


@pytest.mark.parametrize("seed", range(6))
def test_beam_size_one_with_a_length_penalty_scores_at_least_greedy(search_backend, seed):
    """alpha > 0: greedy's hypothesis finishes in the beam too, but the search goes on while a
    longer one could still outrank it, so it returns greedy's or a better-scoring one."""
    alpha = 0.7
    greedy = search_backend.greedy_search(RandomStep(seed, 1), 3, 9, BOS, EOS, PAD)
    beam = search_backend.beam_search(RandomStep(seed, 1), 3, 9, 1, BOS, EOS, PAD, alpha)
    raw = np.array([sum(row) for row in greedy.log_probs.tolist()])
    greedy_score = raw / length_penalty(greedy.lengths, alpha)
    assert (beam.scores >= greedy_score - 1e-15 * np.abs(greedy_score)).all()
    same = (beam.tokens == greedy.tokens).all(axis=1)
    np.testing.assert_allclose(beam.scores[same], greedy_score[same], rtol=1e-15)


def test_beam_size_one_with_a_length_penalty_outscores_greedy():
    """Greedy ends with EOS at once (p .5); with alpha = 1 the beam goes on, because A (raw
    -0.73) could still reach -0.73 / penalty(4) = -0.49 > -0.69, and A EOS does: -0.74 / (7/6)."""
    tables = [{(): {EOS: .5, A: .48, B: .02}, (A,): {EOS: .99, A: .01}}]
    for backend in installed_search_backends():
        greedy, _ = run_greedy(backend, tables, max_len=4)
        off, step_off = run_beam(backend, tables, max_len=4, beam_size=1, alpha=0.0)
        on, step_on = run_beam(backend, tables, max_len=4, beam_size=1, alpha=1.0)
        np.testing.assert_array_equal(greedy.tokens, [padded([EOS], 4)])
        np.testing.assert_array_equal(off.tokens, greedy.tokens)
        assert step_off.calls == 1  # EOS finished as the best candidate: nothing alive can beat it
        np.testing.assert_array_equal(on.tokens, [padded([A, EOS], 4)])
        a_eos = (step_on.lp(0, (), A) + step_on.lp(0, (A,), EOS)) / (7 / 6)
        np.testing.assert_allclose(on.scores, [a_eos], rtol=1e-15)
        assert step_on.calls == 2, backend  # then A A (-5.3 / 1.5) cannot beat A EOS


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(6))
def test_beam_result_invariants(search_backend, seed, alpha):
    k, max_len = 3, 7
    r = search_backend.beam_search(RandomStep(seed, k), 4, max_len, k, BOS, EOS, PAD, alpha,
                                   return_all=True)
    np.testing.assert_array_equal(r.tokens, r.all_tokens[:, 0])  # best first
    np.testing.assert_array_equal(r.scores, r.all_scores[:, 0])
    assert (np.diff(r.all_scores, axis=1) <= 0).all()
    assert not (r.all_tokens == PAD)[..., :1].any()  # pad is never generated
    for b in range(4):
        for j in range(k):
            tokens, length = r.all_tokens[b, j].tolist(), int(r.all_lengths[b, j])
            ends = tokens.index(EOS) + 1 if EOS in tokens else max_len
            assert length == ends and PAD not in tokens[:length]
            assert tokens[length:] == [PAD] * (max_len - length)
    raw = np.array([sum(row) for row in r.step_scores.tolist()])
    assert (r.step_scores[np.arange(max_len) >= r.lengths[:, None]] == 0).all()
    np.testing.assert_allclose(r.scores, raw / ((5 + r.lengths) / 6) ** alpha, rtol=1e-15)
    # Distinct hypotheses: beam search never keeps one sequence twice.
    for b in range(4):
        assert len({tuple(t) for t in r.all_tokens[b].tolist()}) == k


# -- the length penalty and bad input -------------------------------------------------------------
def test_length_penalty_closed_forms():
    assert length_penalty(1, 0.7) == 1.0
    assert length_penalty(7, 1.0) == 2.0
    assert length_penalty(13, 2.0) == 9.0
    np.testing.assert_array_equal(length_penalty(np.arange(1, 9), 0.0), np.ones(8))
    np.testing.assert_allclose(length_penalty(7, 0.5), np.sqrt(2.0), rtol=1e-15)


def test_finished_rows_are_never_read(search_backend):
    """The stub gives finished rows NaN by default; a uniform row must give the same answer."""
    a = search_backend.beam_search(TableStep(STAGGERED_TABLES, 2), 2, 5, 2, BOS, EOS, PAD,
                                   return_all=True)
    b = search_backend.beam_search(TableStep(STAGGERED_TABLES, 2, finished_row=0.0), 2, 5, 2, BOS, EOS,
                                   PAD, return_all=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(max_len=0), ValueError, r"max_len: expected an int >= 1, got 0"),
    (dict(max_len=2.0), TypeError, r"max_len: expected an int >= 1, got 2.0"),
    (dict(beam_size=0), ValueError, r"beam_size: expected an int >= 1, got 0"),
    (dict(beam_size=True), TypeError, r"beam_size: expected an int >= 1, got True"),
    (dict(beam_size=V), ValueError, r"beam_size: expected at most tgt_vocab - 1 = 5 \(pad is never generated\), got 6"),
    (dict(alpha=-0.5), ValueError, r"length_penalty: expected a finite float >= 0"),
    (dict(alpha=float("nan")), ValueError, r"length_penalty: expected a finite float >= 0"),
    (dict(alpha="0.5"), TypeError, r"length_penalty: expected a finite float >= 0 \(GNMT alpha; 0 = none\), got '0.5'"),
    (dict(batch=0), ValueError, r"batch: expected an int >= 1, got 0"),
    (dict(batch=1.0), TypeError, r"batch: expected an int >= 1, got 1.0"),
    (dict(eos=V), ValueError, r"eos_id: expected an int in \[0, 6\), got 6"),
    (dict(eos=None), TypeError, r"eos_id: expected an int in \[0, 6\), got None"),
    (dict(vocab=1), ValueError, r"step.vocab: expected an int >= 2 \(the width of the logits\), got 1"),
    (dict(vocab="6"), TypeError, r"step.vocab: expected an int >= 2 \(the width of the logits\), got '6'"),
])
def test_bad_arguments(search_backend, kwargs, error, needle):
    """The spec's checks (`shared.decoding.check_beam_args`), before the first step, in every backend:
    ``TypeError`` for an argument of the wrong type, ``ValueError`` for one out of range
    (`shared.checks.refusal`)."""
    args = dict(batch=1, max_len=3, beam_size=2, alpha=0.0, eos=EOS, vocab=V) | kwargs
    step = RandomStep(0, args["beam_size"] if isinstance(args["beam_size"], int) else 1)
    step.vocab = args["vocab"]
    with pytest.raises(error, match=needle):
        search_backend.beam_search(step, args["batch"], args["max_len"], args["beam_size"], BOS,
                                   args["eos"], PAD, args["alpha"])


def test_bad_step_output(search_backend):
    """A step's output is checked at every step: NaN or +inf, or nothing but pad above -inf (pad is
    never generated: nothing left to choose) in a row the search reads, the shape (N, vocab);
    a bad shape inside a compiled TF loop fails its ``ensure_shape`` (a TF error: the loop cannot
    raise the spec's ValueError there). The ids are checked against ``step.vocab`` first."""
    def run(fn, vocab=V, beam=None):
        step = stateless_step(fn, vocab)
        if beam is None:
            return search_backend.greedy_search(step, 2, 3, BOS, EOS, PAD)
        return search_backend.beam_search(step, 1, 3, beam, BOS, EOS, PAD)

    bad = (r"step: expected logits without NaN or \+inf, and a token other than pad above -inf, in a "
           r"live row \(step {}\)")
    with pytest.raises(ValueError, match=bad.format(0)):
        run(lambda p: np.full((len(p), V), np.nan))
    with pytest.raises(ValueError, match=bad.format(1)):
        run(lambda p: np.full((len(p), V), np.inf if p.shape[1] == 2 else -1.0))
    with pytest.raises(ValueError, match=bad.format(1)):
        run(lambda p: np.full((len(p), V), -np.inf if p.shape[1] == 2 else -1.0), beam=2)
    only_pad = np.where(np.arange(V) == PAD, 0.0, -np.inf)  # finite lse, and nothing to choose
    for beam in (None, 2):  # greedy chose pad here (NumPy, TF) or token 1 (torch); beam an empty slot
        with pytest.raises(ValueError, match=bad.format(1)):
            run(lambda p: np.tile(only_pad if p.shape[1] == 2 else np.zeros(V), (len(p), 1)), beam=beam)
    if search_backend.name != "tf-function":
        with pytest.raises(ValueError, match=r"step: expected logits of shape \(2, 6\), got shape \(2,\)"):
            run(lambda p: np.zeros(len(p)))
        calls = []

        def shrinking(prefixes):  # the vocabulary may not change between steps
            calls.append(1)
            return np.log(np.full((len(prefixes), V - len(calls) + 1), 0.1))
        with pytest.raises(ValueError, match=r"expected logits of shape \(2, 6\), got shape \(2, 5\)"):
            run(shrinking, beam=2)
    else:
        import tensorflow as tf
        with pytest.raises(tf.errors.InvalidArgumentError):
            run(lambda p: np.zeros(len(p)))
    with pytest.raises(ValueError, match=r"eos_id: expected an int in \[0, 2\), got 2"):
        run(lambda p: np.zeros((len(p), 2)), vocab=2)  # the ids are checked against step.vocab first


@pytest.mark.parametrize("search_backend", ["torch", "tf-eager"], indirect=True)
def test_step_output_of_another_dtype_is_refused(search_backend):
    """A backend runs in ``step.dtype``; a step returning another dtype is refused by name (the
    NumPy spec computes in float64 whatever the step says)."""
    step = stateless_step(lambda p: np.full((len(p), V), -1.0), V, np.float32)  # returns float64
    with pytest.raises(TypeError, match=r"step: expected logits of dtype float32, got float64"):
        search_backend.greedy_search(step, 2, 3, BOS, EOS, PAD)


def test_search_runs_in_the_dtype_of_the_step(search_backend):
    r = search_backend.beam_search(RandomStep(0, 2, np.float32), 2, 5, 2, BOS, EOS, PAD, 0.6, True)
    want = np.float64 if search_backend.name == "reference" else np.float32  # the spec is float64
    assert r.scores.dtype == want and r.all_tokens.dtype == np.int64


def test_every_search_backend_runs_this_suite():
    """The stub tables meet every loop: the spec, torch, TF eager and TF compiled."""
    assert SEARCH_BACKENDS == ["reference", "torch", "tf-eager", "tf-function"]
    assert NATIVE_SEARCH_BACKENDS == SEARCH_BACKENDS + ["tf-xla"]


# -- every backend's loops against the spec, on random and on markov tables -----------------------
def assert_same_result(got, want, where: str) -> None:
    """Identical tokens and lengths; scores equal to rounding (each implementation's own exp and
    log in the log-softmax, TF's pow in the length penalty): a few ulps (SEARCH_FLOAT64)."""
    for name, x, y in zip(type(want)._fields, got, want):
        if "scores" in name or name == "log_probs":
            assert_close(x, y, SEARCH_FLOAT64, f"{name} {where}")
        else:
            np.testing.assert_array_equal(x, y, err_msg=f"{name} {where}")


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (2, 0.0), (3, 0.7), (5, 1.0)])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("search_backend", ["torch", "tf-eager"], indirect=True)
def test_loops_equal_the_spec(search_backend, seed, beam_size, alpha):
    """On random prefix-dependent tables (float64), a backend's loops return the spec's arrays:
    the same tokens, scores equal to rounding. (The compiled TF loop meets the spec on the markov
    tables below, where every step is one big tie.)"""
    want = D.beam_search(RandomStep(seed, beam_size), 3, 8, beam_size, BOS, EOS, PAD, alpha, return_all=True)
    got = search_backend.beam_search(RandomStep(seed, beam_size), 3, 8, beam_size, BOS, EOS, PAD, alpha,
                                     True)
    assert_same_result(got, want, "beam")
    want = D.greedy_search(RandomStep(seed, 1), 3, 8, BOS, EOS, PAD)
    assert_same_result(search_backend.greedy_search(RandomStep(seed, 1), 3, 8, BOS, EOS, PAD), want,
                       "greedy")


def markov_table(seed: int, batch: int, max_len: int) -> np.ndarray:
    """``table[item, t, last token]`` = next-token log-probs ``(B, T, V, V)``, drawn from a few
    probabilities (exact ties everywhere, some impossible tokens); after EOS it is NaN, which the
    loops must never read."""
    rng = np.random.default_rng(seed)
    probs = rng.choice([0.0, 0.05, 0.1, 0.2, 0.3], size=(batch, max_len, V, V))
    probs[..., EOS] += 0.05 * np.arange(max_len)[:, None]  # rows end, at different steps
    with np.errstate(divide="ignore"):
        table = np.log(probs)
    table[..., EOS, :] = np.nan
    return table


@pytest.mark.parametrize("search_backend", NATIVE_SEARCH_BACKENDS, indirect=True)
def test_markov_tables_in_every_mode(search_backend):
    """Every backend (TF eager, tf.function and XLA included) against the spec, on tables full of
    exact ties and read one column at a time (as a cached step reads): identical tokens and
    lengths everywhere (ties within a row are ties of logits, exact in every implementation),
    scores equal to rounding."""
    batch, max_len, ids = 3, 7, (BOS, EOS, PAD)
    for seed, beam_size, alpha in [(0, 0, 0.0), (1, 1, 0.0), (2, 4, 0.0), (3, 4, 0.7), (4, 4, 1.0)]:
        table = markov_table(seed, batch, max_len)
        spec = MarkovStep(table, max(beam_size, 1))
        if beam_size == 0:
            want = D.greedy_search(spec, batch, max_len, *ids)
        else:
            want = D.beam_search(spec, batch, max_len, beam_size, *ids, alpha, return_all=True)
        got = search_backend.markov(table, beam_size, alpha, ids)
        assert_same_result(got, want, f"seed {seed}")


def _ranked(row) -> list[int]:
    """Convention 11's order of one row, in plain Python (no NumPy negation, no overflow): larger
    first, ties by lower index, NaN after everything (-inf included), as NumPy sorts NaN last."""
    values = [v.item() for v in row]
    return sorted(range(len(values)), key=lambda i: (values[i] != values[i], -values[i] if values[i] == values[i]
                                                     else 0, i))


def _tie_heavy(rng, dtype, specials) -> tuple[np.ndarray, int]:
    """A (1..3, 1..3, n) array of few distinct values (ties everywhere, at the k-th value too),
    some entries and some whole rows special, and a k from 1 to n + 1 (k == n and k > n included)."""
    n = int(rng.integers(1, 14))
    x = rng.integers(-2, 2, (int(rng.integers(1, 4)), int(rng.integers(1, 4)), n)).astype(dtype)
    if specials:
        hit = rng.random(x.shape) < 0.3
        x[hit] = rng.choice(specials, int(hit.sum()))
        whole = rng.random(x.shape[:-1]) < 0.15  # a row of -inf, NaN, +inf, 0 alone
        x[whole] = rng.choice(specials, int(whole.sum()))[:, None]
    return x, int(rng.integers(1, n + 2))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_top_lowest_is_the_first_k_of_the_stable_descending_sort(dtype):
    """The spec's selection (`shared.decoding._top_lowest`: argmax, or a partition and a sort of the
    keys at or below the k-th) returns exactly the first k of its definition, the whole stable sort
    ``np.argsort(-x, kind="stable")``, and of convention 11's order written out in Python, on
    tie-heavy rows with NaN, +-inf and +-0 entries and rows. Before: argmax took a NaN as the best
    (k = 1), and a NaN k-th value left no candidates (k > 1: "could not broadcast")."""
    rng = np.random.default_rng(0)
    for _ in range(600):
        x, k = _tie_heavy(rng, dtype, [np.nan, np.inf, -np.inf, 0.0, -0.0])
        got = D._top_lowest(x, k)
        np.testing.assert_array_equal(got, np.argsort(-x, axis=-1, kind="stable")[..., :k], err_msg=f"{x}, k={k}")
        want = [_ranked(row)[:k] for row in x.reshape(-1, x.shape[-1])]
        np.testing.assert_array_equal(got.reshape(len(want), -1), want, err_msg=f"{x}, k={k}")


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint8", "bool"])
def test_top_lowest_on_integers_reaches_the_extremes(dtype):
    """Integers and bools rank as convention 11 says down to their minimum and maximum. Before:
    the key ``-x`` wrapped (the minimum of a signed type, every unsigned value), so int8 -128
    ranked first, and the partition then kept too few candidates: ``[[2, 2, 2]]`` for
    ``int8 [[-128, 0, 127, 1, -128]], k=3``, a repeated index."""
    info = np.iinfo(dtype) if dtype != "bool" else None
    extremes = [info.min, info.max, 0, 1] if info else [True, False]
    rng = np.random.default_rng(1)
    for _ in range(300):
        x, k = _tie_heavy(rng, "int64", [])
        x = np.where(rng.random(x.shape) < 0.3, rng.choice(extremes, x.shape), x % 2 if info is None else x)
        x = x.astype(dtype)
        want = [_ranked(row)[:k] for row in x.reshape(-1, x.shape[-1])]
        np.testing.assert_array_equal(D._top_lowest(x, k).reshape(len(want), -1), want, err_msg=f"{x}, k={k}")


def test_top_lowest_widens_bfloat16():
    """ml_dtypes' bfloat16 (TensorFlow's and JAX's) has no NaN order in NumPy's sort, so it is
    widened to float64 (exactly) first: the same indices as the float64 values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    for _ in range(200):
        x, k = _tie_heavy(rng, "float64", [np.nan, np.inf, -np.inf, 0.0])
        np.testing.assert_array_equal(D._top_lowest(x.astype(ml_dtypes.bfloat16), k), D._top_lowest(x, k))


@pytest.mark.parametrize("framework", ["reference", "torch", "tf"])
def test_step_contract_is_checked(framework):
    """A step that is not one (no ``reorder`` for beam search, not callable) is refused before the
    first step, and a call that does not return ``(logits, state)`` is named as such, by every
    implementation alike (they were Python's own AttributeError and unpacking errors)."""
    if framework == "reference":
        from shared import decoding as search
        zeros = lambda n: np.zeros((n, V))  # noqa: E731
        dtype = np.float64
    elif framework == "torch":
        torch = pytest.importorskip("torch")
        from torch_impl import search
        zeros = lambda n: torch.zeros(n, V, dtype=torch.float64)  # noqa: E731
        dtype = torch.float64
    else:
        tf = pytest.importorskip("tensorflow")
        from tf_impl import search
        zeros = lambda n: tf.zeros((n, V), tf.float64)  # noqa: E731
        dtype = tf.float64

    class NoReorder:  # the contract but reorder; its call returns logits alone when told
        vocab = V

        def __init__(self, tuple_out=True):
            self.dtype, self.tuple_out = dtype, tuple_out

        def initial_state(self):
            return ()

        def __call__(self, prefixes, t, state):
            logits = zeros(prefixes.shape[0])
            return (logits, state) if self.tuple_out else logits

    with pytest.raises(TypeError, match=re.escape("step: expected a Step (callable, with initial_state() "
                                                  "and reorder()), got NoReorder without reorder()")):
        search.beam_search(NoReorder(), 1, 3, 2, BOS, EOS, PAD)
    search.greedy_search(NoReorder(), 1, 2, BOS, EOS, PAD)  # greedy never reorders
    with pytest.raises(TypeError, match=re.escape("got int without __call__(), initial_state()")):
        search.greedy_search(3, 1, 2, BOS, EOS, PAD)
    with pytest.raises(TypeError, match=r"step: expected a tuple \(logits, state\), got (Tensor|EagerTensor|ndarray)"):
        search.greedy_search(NoReorder(tuple_out=False), 1, 2, BOS, EOS, PAD)


def test_search_buffers_that_cannot_fit_are_refused(search_backend):
    """``max_len`` and ``batch`` size the loop's buffers before any step: 10**12 tokens used to
    fail in NumPy's or a framework's allocator (or run until the memory ran out)."""
    step = stateless_step(lambda p: np.zeros((len(p), V)), V)
    with pytest.raises(ValueError, match=r"batch, max_len: the search's buffers for 1 rows of "
                                         r"1,000,000,000,000 tokens \(vocab 6\) need at least"):
        search_backend.greedy_search(step, 1, 10**12, BOS, EOS, PAD)
    with pytest.raises(ValueError, match=r"the search's buffers for 20,000,000,000 rows of 3 tokens"):
        search_backend.beam_search(step, 10**10, 3, 2, BOS, EOS, PAD)
    # NumPy's small ints: the product was computed in theirs and wrapped (int32) or overflowed (int16)
    with pytest.raises(ValueError, match=r"the search's buffers for 1,000,000,000 rows of 1,000,000 tokens"):
        search_backend.greedy_search(step, np.int32(10**9), np.int32(10**6), BOS, EOS, PAD)


def test_complex_or_text_logits_are_refused_by_the_reference():
    """The NumPy search widens a step's logits to float64: a complex step lost its imaginary part
    (with only NumPy's ComplexWarning), text raised NumPy's conversion error. The backends refuse
    any dtype but ``step.dtype`` (test_step_output_of_another_dtype_is_refused)."""
    from shared import decoding as D
    for logits, name in ((np.zeros((1, V), complex), "complex128"), (np.full((1, V), "a"), "str32")):
        step = stateless_step(lambda p, x=logits: np.repeat(x, len(p), axis=0), V)
        with pytest.raises(TypeError, match=f"step: expected real logits, got dtype {name}"):
            D.greedy_search(step, 1, 2, BOS, EOS, PAD)
