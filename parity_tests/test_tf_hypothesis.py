"""Hypothesis-generated configurations and inputs: tf_impl vs the reference in float64, every traced
intermediate and the plain call's logits. Small examples, bounded by the suite's profile."""
import numpy as np
import pytest

pytest.importorskip("tensorflow")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from parity_tests.inputs import src_tgt  # noqa: E402
from parity_tests.tf_support import build, run_logits, run_trace  # noqa: E402
from parity_tests.tolerances import assert_close, assert_trace_close, bound_for  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402


@st.composite
def cases(draw):
    n_heads = draw(st.sampled_from([1, 2, 3, 4]))
    style = draw(st.sampled_from(["standard", "annotated"]))
    d_k = draw(st.integers(2 if style == "annotated" and n_heads == 1 else 1, 4))
    share = draw(st.booleans())
    src_vocab = draw(st.integers(4, 12))
    tgt_vocab = src_vocab if share else draw(st.integers(4, 12))
    max_len = draw(st.integers(4, 10))
    config = TransformerConfig(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=n_heads * d_k, n_heads=n_heads,
        d_ff=draw(st.integers(1, 12)), n_encoder_layers=draw(st.integers(1, 2)),
        n_decoder_layers=draw(st.integers(1, 2)), dropout=0.1, max_len=max_len,
        norm_first=draw(st.booleans()), norm_style=style,
        norm_eps=draw(st.sampled_from([1e-6, 1e-3, 0.5])),
        final_norm=draw(st.sampled_from([None, True, False])), share_embeddings=share,
        tie_output=draw(st.booleans()), dtype="float64")
    batch = draw(st.integers(1, 3))
    src_len, tgt_len = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    src_lengths = draw(st.lists(st.integers(0, src_len), min_size=batch, max_size=batch))
    tgt_lengths = draw(st.lists(st.integers(0, tgt_len), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    src, tgt = src_tgt(config, batch, src_len, tgt_len, seed, src_lengths, tgt_lengths)
    return config, src, tgt, seed


@settings(max_examples=60)  # ~0.4 s each on 2 cores: about 25 s
@given(cases())
def test_random_configs_match_reference_float64(case):
    config, src, tgt, seed = case
    weights = random_weights(config, seed)
    ref_logits, ref_trace = R.forward(weights, config, src, tgt, return_trace=True)
    model = build(config, weights)
    bound = bound_for("float64", "tf:reference")
    trace = run_trace(model, src, tgt)
    assert_trace_close(trace, ref_trace, bound)
    assert_close(run_logits(model, src, tgt), ref_logits, bound, "logits (plain call)")
    assert np.isfinite(ref_logits).all()
