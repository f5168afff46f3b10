"""`shared.conditioning` (each layer norm's conditioning and each attention's largest score, read from
the oracle's trace) and the bounds they grow (`shared.tolerances.Bound.conditioned`,
`trace_bounds`). NumPy only: the runs that need the growth are test_half_precision.py's and
test_attention_scores.py's."""
import math

import numpy as np
import pytest

from shared import TransformerConfig, reference
from shared.conditioning import (attention_inputs, attention_scores, forward_conditioning,
                                 layer_norm_conditioning, norm_conditioning, norm_inputs)
from shared.tolerances import (VARIANTS_CONDITIONING, HALF_CONDITIONING, SCORE_EXPONENT, SCORE_LIMIT, Bound,
                               bound_for, trace_bounds)
from shared.weights import random_weights

from . import variant_configs as VC

CONFIGS = {
    "pre-norm standard": VC.config("no-pad-mask"),
    "post-norm, no final norm": VC.config("all-sinusoidal"),
    "post-norm with final norms": VC.config("all-sinusoidal").replace(final_norm=True),
    "pre-norm annotated (tiny)": TransformerConfig.preset("tiny", dropout=0.0, dtype="float64"),
}


def oracle(config: TransformerConfig, seed: int = 0):
    weights = random_weights(config, seed)
    src = np.array([[5, 6, 7, 8, 2, 0], [9, 4, 2, 0, 0, 0]]) % config.src_vocab
    tgt = np.array([[1, 5, 6, 7], [1, 9, 4, 2]]) % config.tgt_vocab
    return weights, reference.forward(weights, config, src, tgt, return_trace=True)[1]


@pytest.mark.parametrize("name", CONFIGS)
def test_norm_inputs_are_the_arrays_the_oracle_normalised(name, monkeypatch):
    config = CONFIGS[name]
    seen = {}
    normalise = reference.Model.norm

    def recording(self, x, prefix):
        seen[prefix] = x
        return normalise(self, x, prefix)
    monkeypatch.setattr(reference.Model, "norm", recording)
    weights, trace = oracle(config)
    rebuilt = norm_inputs(config, trace)
    assert list(rebuilt) == [n for n in trace if n.endswith("_norm")] and set(rebuilt) == set(seen)
    for norm, x in seen.items():
        np.testing.assert_array_equal(rebuilt[norm], x, err_msg=norm)  # the same float64 sums
    kappas = norm_conditioning(config, weights, trace)
    assert list(kappas) == list(rebuilt)
    for norm, kappa in kappas.items():
        assert kappa == layer_norm_conditioning(seen[norm], trace[norm], weights[f"{norm}.gamma"],
                                                config.norm_style, config.norm_eps)


def test_one_norm_by_hand():
    """Rows ``[1, -1, 1, -1]`` and ``[3, 1, 3, 1]`` spread by 1 each: the input's scale is 3, the
    output's ``max|gamma|`` = 2 (beta 0), so an input error of 1e-3 of 3 can leave the norm as
    3e-3 / 1 * 2 absolute, 1.5e-3 of the output's scale 2: kappa 3 / 2 * 2 / 1 = 3."""
    x = np.array([[1.0, -1, 1, -1], [3, 1, 3, 1]])
    gamma, beta = np.array([2.0, 1, 1, 1]), np.zeros(4)
    for style, eps, spread in (("standard", 1e-6, math.sqrt(1 + 1e-6)),
                               ("annotated", 1e-6, math.sqrt(4 / 3) + 1e-6)):
        y = reference.layer_norm(x, gamma, beta, style, eps)
        want = 3 * 2 / (spread * max(np.abs(y).max(), 1))
        assert layer_norm_conditioning(x, y, gamma, style, eps) == pytest.approx(want, rel=1e-12)
    # a row that barely spreads: kappa grows as its spread shrinks
    tight = np.array([[1.0, -1, 1, -1], [3, 2.9, 3, 2.9]])
    y = reference.layer_norm(tight, gamma, beta, "standard", 1e-6)
    assert layer_norm_conditioning(tight, y, gamma, "standard", 1e-6) > 19 * 3 / 2


def test_a_constant_row_is_finite():
    """A row without spread is divided by ``sqrt(eps)``: kappa large, never inf or NaN."""
    x = np.array([[2.0, 2, 2, 2]])
    y = reference.layer_norm(x, np.ones(4), np.zeros(4), "standard", 1e-6)
    kappa = layer_norm_conditioning(x, y, np.ones(4), "standard", 1e-6)
    assert kappa == pytest.approx(2 / math.sqrt(1e-6))


def test_a_bound_grows_past_its_conditioning_only():
    bound = bound_for("float16", "torch:reference")
    assert bound.conditioning == HALF_CONDITIONING
    assert bound.conditioned(0.0) is bound and bound.conditioned(HALF_CONDITIONING) is bound
    grown = bound.conditioned(3 * HALF_CONDITIONING)
    assert grown.rtol == pytest.approx(3 * bound.rtol) and grown.conditioning == bound.conditioning
    assert grown.reason.startswith(bound.reason) and "grown x3" in grown.reason
    # float32's measured over the variants hold to their largest conditioning, 7.7, and grow past it
    f32 = bound_for("float32", "torch:reference")
    assert f32.conditioning == VARIANTS_CONDITIONING and f32.conditioned(VARIANTS_CONDITIONING) is f32
    assert f32.conditioned(2 * VARIANTS_CONDITIONING).rtol == pytest.approx(2 * f32.rtol)
    for pair in ("torch:tf", "tf:reference", "decode-margin", "onnx:reference", "onnx:torch", "onnx:tf"):
        assert bound_for("float32", pair).conditioning == VARIANTS_CONDITIONING, pair
    for pair in ("onnx:reference", "onnx:torch", "onnx:tf"):  # ONNX Runtime's float16: measured over the variants
        assert bound_for("float16", pair).conditioning == VARIANTS_CONDITIONING, pair
    for pair in ("ctranslate2:reference", "transformers:torch", "keras-source:tf"):  # another family's models
        fixed = bound_for("float32", pair)
        assert fixed.conditioning is None and fixed.conditioned(1e6) is fixed


@pytest.mark.parametrize("kappa, error", [(math.nan, ValueError), (math.inf, ValueError), (-1.0, ValueError),
                                          (True, TypeError), ("2", TypeError), (None, TypeError)])
def test_a_conditioning_that_is_no_finite_number_is_refused(kappa, error):
    with pytest.raises(error, match=r"^kappa: expected a finite float >= 0, got "):
        bound_for("bfloat16", "tf:reference").conditioned(kappa)
    with pytest.raises(error, match=r"^score: expected a finite float >= 0, got "):
        bound_for("float32", "tf:reference").conditioned(0.0, kappa)


def test_a_bound_grows_past_its_score_limit_and_the_two_excesses_add():
    bound = bound_for("float32", "torch:reference")
    assert bound.score_limit == SCORE_LIMIT and bound.grown is None
    assert bound.conditioned(0.0, SCORE_LIMIT) is bound and bound.conditioned(VARIANTS_CONDITIONING, 0.0) is bound
    grown = bound.conditioned(0.0, 4 * SCORE_LIMIT)
    assert grown.rtol == pytest.approx(bound.rtol * 4 ** SCORE_EXPONENT) == pytest.approx(8 * bound.rtol)
    assert grown.grown.startswith("grown x8: an attention upstream scores 30 > 7.5")
    assert grown.reason == f"{bound.reason}; {grown.grown}"
    half = bound_for("bfloat16", "torch:tf")
    both = half.conditioned(3 * HALF_CONDITIONING, 4 * SCORE_LIMIT)  # 1 + (3 - 1) + (8 - 1)
    assert both.rtol == pytest.approx(10 * half.rtol)
    assert "a layer norm upstream has conditioning 4.5 > 1.5 and an attention upstream scores 30" in both.grown
    for never in (bound_for("float64", "torch:reference"), bound_for("float32", "grad:torch:tf"),
                  bound_for("bfloat16", "train:torch:tf")):  # float64's and the training bounds
        assert never.conditioned(1e6, 1e6) is never


def test_trace_bounds_take_the_largest_score_computed_so_far():
    bound = Bound(rtol=1e-2, reason="r", conditioning=2.0, score_limit=5.0)
    names = ["embed", "a.weights", "a", "b_norm", "b.weights", "logits"]
    bounds = trace_bounds(bound, {"b_norm": 4.0}, names, {"a.weights": 20.0, "b.weights": 10.0})
    # 8 = (20 / 5) ** 1.5 from a.weights on; b_norm's conditioning adds 4 / 2 - 1
    assert [round(b.rtol, 12) for b in bounds.values()] == [1e-2, 8e-2, 8e-2, 9e-2, 9e-2, 9e-2]
    assert trace_bounds(bound, {}, names) == trace_bounds(bound, {}, names, {})  # scores optional


@pytest.mark.parametrize("name", CONFIGS)
def test_attention_inputs_reproduce_the_oracle_weights(name):
    """The rebuilt query input, memory and allowed keys, run through the oracle's own attention,
    give the traced weights bit for bit (pre- and post-norm, cross-attention's memory, masks)."""
    config = CONFIGS[name]
    weights, trace = oracle(config)
    inputs = attention_inputs(config, trace)
    assert list(inputs) == [n for n in trace if n.endswith("attn.weights")]
    for weights_name, (query, memory, allowed) in inputs.items():
        prefix = weights_name[:-len(".weights")]
        _, again = reference.attention(query, memory, allowed, weights, prefix, config.n_heads, config.head_dim)
        np.testing.assert_array_equal(again, trace[weights_name], err_msg=weights_name)


def test_attention_scores_weigh_each_row_by_its_softmax():
    config = CONFIGS["pre-norm annotated (tiny)"]
    weights, trace = oracle(config)
    scores = attention_scores(config, weights, trace)
    assert list(scores) == [n for n in trace if n.endswith("attn.weights")]
    width = config.d_model // config.n_heads
    for name, (query, memory, allowed) in attention_inputs(config, trace).items():
        prefix = name[:-len(".weights")]
        q = (query @ weights[f"{prefix}.query.kernel"] + weights[f"{prefix}.query.bias"]).reshape(
            *query.shape[:2], config.n_heads, width)
        k = (memory @ weights[f"{prefix}.key.kernel"] + weights[f"{prefix}.key.bias"]).reshape(
            *memory.shape[:2], config.n_heads, width)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(width)
        rows = (trace[name] * np.abs(s)).sum(-1)[allowed.sum(-1) >= 2]
        assert scores[name] == pytest.approx(rows.max(), rel=1e-12)
    # kernels times 3: scores 9 times larger, where random weights stay below the limit
    scaled = {n: v * 3 if n.endswith((".query.kernel", ".key.kernel")) else v for n, v in weights.items()}
    src, tgt = np.array([[5, 6, 7, 8, 2]]), np.array([[1, 5, 6, 7]])
    assert forward_conditioning(weights, config, src, tgt)[1] < SCORE_LIMIT
    assert forward_conditioning(scaled, config, src, tgt)[1] > 3 * SCORE_LIMIT


def test_a_row_of_one_key_carries_no_score():
    """A decoder of one position attends to itself alone: weight 1 whatever the score."""
    config = CONFIGS["pre-norm annotated (tiny)"]
    weights = random_weights(config, 0)
    scaled = {n: v * 100 if n.endswith((".query.kernel", ".key.kernel")) else v for n, v in weights.items()}
    _, trace = reference.forward(scaled, config, np.array([[5, 6, 2]]), np.array([[1]]), return_trace=True)
    scores = attention_scores(config, scaled, trace)
    assert scores["decoder.layers.0.self_attn.weights"] == 0.0
    assert scores["encoder.layers.0.self_attn.weights"] > 100


def test_trace_bounds_take_the_worst_norm_computed_so_far():
    bound = Bound(rtol=1e-2, reason="r", conditioning=2.0)
    names = ["embed", "a_norm", "a", "b_norm", "b", "logits"]
    bounds = trace_bounds(bound, {"a_norm": 6.0, "b_norm": 4.0}, names)
    assert list(bounds) == names
    assert [round(b.rtol, 12) for b in bounds.values()] == [1e-2, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2]
    unconditioned = Bound(rtol=1e-2, reason="r")
    assert all(b is unconditioned for b in trace_bounds(unconditioned, {"a_norm": 6.0}, names).values())


def test_inputs_that_name_no_norm_input_are_refused():
    config = CONFIGS["post-norm, no final norm"]
    _, trace = oracle(config)
    with pytest.raises(ValueError, match=r"^trace: expected an embed entry before 'encoder.layers.0"):
        norm_inputs(config, {k: v for k, v in trace.items() if k != "encoder.embed"})
    with pytest.raises(ValueError, match=r"^trace: expected encoder.layers.0.self_attn.output before"):
        norm_inputs(config, {k: v for k, v in trace.items() if k != "encoder.layers.0.self_attn.output"})
    with pytest.raises(ValueError, match=r"^x, y: expected one shape \(\.\.\., d\) with d >= 1 \('standard' "
                                         r"norm\), got \(2, 3\) and \(2, 4\)$"):
        layer_norm_conditioning(np.zeros((2, 3)), np.zeros((2, 4)), np.ones(3), "standard", 1e-6)
    with pytest.raises(ValueError, match=r"^x, y: expected one shape \(\.\.\., d\) with d >= 2 \('annotated' "
                                         r"norm\), got \(2, 1\) and \(2, 1\)$"):
        layer_norm_conditioning(np.ones((2, 1)), np.ones((2, 1)), np.ones(1), "annotated", 1e-6)


def test_a_norm_of_one_feature_passes_on_no_error():
    """``d_model=1`` (a config the ``standard`` norm allows): each row centred on its own mean is 0
    exactly, so every norm's output is its ``beta`` whatever the input, and its conditioning is 0;
    `twins compare` failed on such a model ("expected ... d >= 2")."""
    config = TransformerConfig(src_vocab=6, tgt_vocab=6, d_model=1, n_heads=1, d_ff=2, n_encoder_layers=1,
                               n_decoder_layers=1, max_len=8, dropout=0.0, dtype="float64")
    weights, trace = oracle(config)
    kappas = norm_conditioning(config, weights, trace)
    assert kappas and set(kappas.values()) == {0.0}
    for norm in kappas:  # the reason: the output is beta, exactly
        np.testing.assert_array_equal(trace[norm], np.broadcast_to(weights[f"{norm}.beta"], trace[norm].shape))


def test_a_decode_margin_is_taken_on_the_logits_scale():
    """`shared.divergence.decode_margin`: the precision's ``decode-margin`` bound, grown by the
    oracle's pass along its tokens, times that pass's logits' scale ``max(max|z|, 1)``. A model whose
    logits are ten or twenty times larger (its generator's kernel and bias scaled: no norm or
    attention before them changes) gets that much more margin, as its logits' rounding has: a
    bfloat16 logit of 20 is rounded to a multiple of 2**-3, more than the margin written for the
    random models' logits of about 2."""
    from shared.divergence import _teacher_forced, decode_margin
    config = CONFIGS["pre-norm annotated (tiny)"]
    weights = random_weights(config, 0)
    src = np.array([[5, 6, 7, 8, 2, 0], [9, 4, 2, 0, 0, 0]]) % config.src_vocab
    tokens = reference.greedy_decode(reference.Model(weights, config), src, 6).tokens
    logits, trace = reference.forward(weights, config, src, _teacher_forced(config, tokens), return_trace=True)
    assert decode_margin("float64", weights, config, src, tokens) == pytest.approx(  # float64's does not grow
        bound_for("float64", "decode-margin").rtol * max(np.abs(logits).max(), 1.0), rel=1e-12)
    grown = bound_for("bfloat16", "decode-margin").conditioned(*forward_conditioning(
        weights, config, src, _teacher_forced(config, tokens)))
    assert decode_margin("bfloat16", weights, config, src, tokens) == pytest.approx(
        grown.rtol * max(np.abs(logits).max(), 1.0), rel=1e-12)
    margins = []
    for factor in (10.0, 20.0):
        scaled = {n: v * factor if n.startswith("generator.") else v for n, v in weights.items()}
        margins.append(decode_margin("bfloat16", scaled, config, src, tokens))  # the same tokens' pass
    assert margins[0] > grown.rtol * 9 and margins[1] == pytest.approx(2 * margins[0], rel=1e-12)
