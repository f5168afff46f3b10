"""CTranslate2 as a peer of the decoders, on models exported with ``--to ctranslate2``.

Where the semantics coincide the tokens must be identical (or part at a float32 near-tie of the
oracle's, reported): greedy against ``translate_batch(beam_size=1)``; beam search against
CTranslate2's beam search with ``length_penalty=0``. CTranslate2's beam search, read in its
``src/decoding.cc`` (``BeamSearch::search``), draws 2K candidates a step, finishes an EOS candidate
only among the first K and refills the beam with the next candidates not ending in EOS, as the
spec does. It differs in:

* **length penalty**: ``score / length ** length_penalty`` (not GNMT's ``((5 + L) / 6) ** alpha``),
  applied when a hypothesis is finalised; compared here with both off (its 0, our alpha 0);
* **stopping**: with no penalty it stops an item once its best candidate of a step is EOS
  (``allow_early_exit``); with a penalty once K hypotheses have finished (``patience`` 1). Without
  a penalty that EOS hypothesis is the best there will be, and the spec's rule (stop when nothing
  alive can beat the K-th finished one) returns the same best hypothesis, so the best hypothesis
  is compared, not all K;
* **EOS at the first step**: its ``min_decoding_length`` defaults to 1, which forbids EOS there
  and takes it out of that step's normaliser; it is set to 0;
* **pad**: it never generates the unknown token, which the export names pad, and takes it out of
  the log-softmax's normaliser; the spec keeps pad in it. The models here give pad a logit of
  -1e9 (probability exactly 0 in float32), so both normalise over the same tokens.
"""
import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2")
torch = pytest.importorskip("torch")
from shared.exporters import ctranslate2 as export  # noqa: E402

import torch_impl  # noqa: E402
from parity_tests.decoding_cases import MAX_LEN, config64, sources, weights_for  # noqa: E402
from parity_tests.torch_support import build  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.divergence import first_divergence  # noqa: E402
from shared.loss import log_softmax  # noqa: E402
from shared.tolerances import bound_for  # noqa: E402

MARGIN = bound_for("float32", "decode-margin").rtol
VARIANT = "tiny-post-standard"  # CTranslate2's layer norm is the standard one


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A float32 model, its torch_impl twin and its CTranslate2 export, per seed."""
    cases = {}
    for seed in range(2):
        c64 = config64(VARIANT)
        w64 = weights_for(c64, seed)
        w64["generator.bias"][c64.pad_id] = -1e9
        config = c64.replace(dtype="float32")
        w32 = {name: value.astype(np.float32) for name, value in w64.items()}
        path = tmp_path_factory.mktemp(f"ct2-{seed}") / "model"
        export.to_ctranslate2(config, w32, path)
        translator = ctranslate2.Translator(str(path), device="cpu", compute_type="float32",
                                            intra_threads=1)
        src = sources(c64, seed, lengths=(7, 5, 2, 1, 6))  # no all-padding row: CTranslate2 skips it
        cases[seed] = (c64, w64, config, build(config, w32), translator, src)
    return cases


def margins(c64, w64, src, tokens):
    """The oracle's step log-probs along ``tokens`` (pad impossible), for `first_divergence`."""
    tgt = np.concatenate([np.full((len(src), 1), c64.start_id), tokens[:, :-1]], axis=1)
    lp = log_softmax(R.forward(w64, c64, src, tgt))
    lp[..., c64.pad_id] = -np.inf
    return lp


def assert_same_or_near_tie(c64, w64, src, want, got, what):
    divergences = first_divergence(want, got, margins(c64, w64, src, want))
    unexplained = [d for d in divergences if not d.margin <= MARGIN]
    assert not unexplained, f"{what}: " + "; ".join(map(str, unexplained))
    return divergences


@pytest.mark.parametrize("seed", range(2))
def test_greedy_tokens_equal_ctranslate2(case, seed):
    c64, w64, config, model, translator, src = case[seed]
    ours = torch_impl.greedy_decode(model, src, MAX_LEN)
    results = translator.translate_batch(export.source_tokens(config, src), beam_size=1,
                                         max_decoding_length=MAX_LEN, return_end_token=True,
                                         disable_unk=True, max_input_length=0,
                                         min_decoding_length=0)
    theirs = np.full_like(ours.tokens, config.pad_id)
    for b, r in enumerate(results):
        ids = [int(t) for t in r.hypotheses[0]]
        theirs[b, :len(ids)] = ids
    divergences = assert_same_or_near_tie(c64, w64, src, ours.tokens, theirs, "greedy")
    assert len(divergences) == 0, divergences  # measured: none on these cases


@pytest.mark.parametrize("seed", range(2))
def test_beam_best_hypothesis_equals_ctranslate2(case, seed):
    """K = 3, no length penalty: the best hypothesis's tokens, and its raw score within the
    float32 decode margin times its length (sums of float32 log-probs from two libraries;
    measured: 9.5e-7 on scores near -10)."""
    c64, w64, config, model, translator, src = case[seed]
    ours = torch_impl.beam_search(model, src, MAX_LEN, 3, 0.0)
    results = translator.translate_batch(export.source_tokens(config, src), beam_size=3,
                                         length_penalty=0.0, num_hypotheses=1, return_scores=True,
                                         max_decoding_length=MAX_LEN, return_end_token=True,
                                         disable_unk=True, max_input_length=0,
                                         min_decoding_length=0)
    theirs = np.full_like(ours.tokens, config.pad_id)
    scores = np.zeros(len(results))
    for b, r in enumerate(results):
        ids = [int(t) for t in r.hypotheses[0]]
        theirs[b, :len(ids)], scores[b] = ids, r.scores[0]
    divergences = assert_same_or_near_tie(c64, w64, src, ours.tokens, theirs, "beam")
    same = [b for b in range(len(src)) if b not in {d.item for d in divergences}]
    assert len(same) >= 4
    np.testing.assert_allclose(scores[same], ours.scores[same], rtol=0,
                               atol=MARGIN * MAX_LEN)
