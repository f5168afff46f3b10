"""The NumPy oracle checked against closed forms, naive loops and invariances (not against itself)."""
import numpy as np
import pytest

from shared.batches import src_tgt
from shared.tolerances import SELF_FLOAT64, assert_close
from shared import TransformerConfig, make_src_mask, make_tgt_mask, positional_encoding
from shared import reference as R
from shared.weights import random_weights, tgt_embedding_name

TINY = TransformerConfig.preset("tiny", dtype="float64")
VARIANTS = {
    "pre-annotated": TINY,
    "post-standard": TINY.replace(norm_first=False, norm_style="standard"),
    "pre-standard-shared-tied": TINY.replace(norm_style="standard", tgt_vocab=13, share_embeddings=True,
                                             tie_output=True),
    "post-annotated-tied": TINY.replace(norm_first=False, tie_output=True),
}


@pytest.mark.parametrize("preset", ["tiny", "base"])
def test_forward_runs_presets_batch2_len16(preset):
    config = TransformerConfig.preset(preset, dtype="float64")
    w = random_weights(config, 0)
    src, tgt = src_tgt(config, batch=2, src_len=16, tgt_len=16)
    logits, trace = R.forward(w, config, src, tgt, return_trace=True)
    assert logits.shape == (2, 16, config.tgt_vocab) and logits.dtype == np.float64
    assert np.isfinite(logits).all()
    assert list(trace) == R.trace_names(config)
    assert trace["encoder.layers.0.self_attn.weights"].shape == (2, config.n_heads, 16, 16)
    assert trace["decoder.layers.0.cross_attn.weights"].shape == (2, config.n_heads, 16, 16)
    np.testing.assert_array_equal(trace["logits"], logits)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_trace_structure(variant):
    config = VARIANTS[variant]
    w = random_weights(config, 1)
    src, tgt = src_tgt(config, batch=3, src_len=6, tgt_len=4)
    logits, trace = R.forward(w, config, src, tgt, return_trace=True)
    assert list(trace) == R.trace_names(config)
    pe = positional_encoding(config.max_len, config.d_model)
    emb = w["src_embed.embeddings"][src] * np.sqrt(config.d_model) + pe[:6]
    np.testing.assert_array_equal(trace["encoder.embed"], emb)
    table = w[tgt_embedding_name(config)]
    kernel = table.T if config.tie_output else w["generator.kernel"]
    np.testing.assert_array_equal(logits, trace["decoder.output"] @ kernel + w["generator.bias"])
    for name in R.trace_names(config):
        if name.endswith(".residual") and not config.norm_first:  # post-norm: the norm is the residual
            np.testing.assert_array_equal(trace[name], trace[name.replace(".residual", "_norm")])
    last = trace[R.trace_names(config)[-3]]  # decoder stream before .output
    np.testing.assert_array_equal(trace["decoder.output"], last)


def _naive_attention(x, mem, mask, w, prefix, n_heads):
    """Loops over batch, head, query and key: the textbook formula, no broadcasting tricks."""
    b_, q_len, d = x.shape
    k_len, d_k = mem.shape[1], d // n_heads
    proj = {p: (x if p == "query" else mem) @ w[f"{prefix}.{p}.kernel"] + w[f"{prefix}.{p}.bias"]
            for p in ("query", "key", "value")}
    weights = np.zeros((b_, n_heads, q_len, k_len))
    context = np.zeros((b_, q_len, d))
    for b in range(b_):
        for h in range(n_heads):
            cols = slice(h * d_k, (h + 1) * d_k)
            for i in range(q_len):
                allowed = [j for j in range(k_len) if np.broadcast_to(mask, (b_, n_heads, q_len, k_len))[b, h, i, j]]
                if not allowed:
                    continue
                s = {j: proj["query"][b, i, cols] @ proj["key"][b, j, cols] / np.sqrt(d_k) for j in allowed}
                m = max(s.values())
                z = sum(np.exp(v - m) for v in s.values())
                for j in allowed:
                    weights[b, h, i, j] = np.exp(s[j] - m) / z
                    context[b, i, cols] += weights[b, h, i, j] * proj["value"][b, j, cols]
    return context @ w[f"{prefix}.output.kernel"] + w[f"{prefix}.output.bias"], weights


def test_attention_matches_naive_loops_with_zero_rows():
    config = TINY
    w = random_weights(config, 2)
    rng = np.random.default_rng(0)
    x, mem = rng.normal(size=(3, 4, 16)), rng.normal(size=(3, 5, 16))
    src = np.array([[3, 4, 5, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    mask = make_src_mask(src, 0)
    prefix = "decoder.layers.0.cross_attn"
    out, weights = R.attention(x, mem, mask, w, prefix, config.n_heads)
    out2, weights2 = _naive_attention(x, mem, mask, w, prefix, config.n_heads)
    assert_close(weights, weights2, SELF_FLOAT64, "weights")
    assert_close(out, out2, SELF_FLOAT64, "output")
    assert (weights[~np.broadcast_to(mask, weights.shape)] == 0).all()  # exactly zero, not tiny
    np.testing.assert_allclose(weights[:2].sum(-1), 1.0, rtol=1e-15)
    assert (weights[2] == 0).all()  # no allowed key: zero weights ...
    np.testing.assert_array_equal(out[2], np.broadcast_to(w[f"{prefix}.output.bias"], (4, 16)))  # ... zero context


@pytest.mark.parametrize("style", ["standard", "annotated"])
def test_layer_norm_closed_forms(style):
    rng = np.random.default_rng(1)
    x, g, b = rng.normal(size=(2, 3, 8)) * 5 + 2, rng.normal(size=8), rng.normal(size=8)
    eps = 1e-3
    y = R.layer_norm(x, g, b, style, eps)
    mean = x.mean(-1, keepdims=True)
    if style == "standard":  # torch.nn.LayerNorm / keras LayerNormalization
        want = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b
    else:  # Annotated Transformer: unbiased std, eps outside the sqrt
        std = np.sqrt(((x - mean) ** 2).sum(-1, keepdims=True) / (x.shape[-1] - 1))
        want = (x - mean) / (std + eps) * g + b
    assert_close(y, want, SELF_FLOAT64, style)


def test_all_padding_source_gives_zero_attention_not_nan():
    config = TINY
    w = random_weights(config, 3)
    src, tgt = src_tgt(config, batch=2, src_len=5, tgt_len=4, src_lengths=[5, 0], tgt_lengths=[4, 0])
    logits, trace = R.forward(w, config, src, tgt, return_trace=True)
    assert np.isfinite(logits).all()
    assert (trace["encoder.layers.0.self_attn.weights"][1] == 0).all()
    assert (trace["decoder.layers.1.cross_attn.weights"][1] == 0).all()
    assert (trace["decoder.layers.0.self_attn.weights"][1] == 0).all()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_source_padding_is_invisible(variant):
    """Appending padding to the source changes nothing for the real tokens or the logits."""
    config = VARIANTS[variant]
    w = random_weights(config, 4)
    src, tgt = src_tgt(config, batch=2, src_len=5, tgt_len=4, src_lengths=[5, 3])
    longer = np.concatenate([src, np.full((2, 3), config.pad_id)], axis=1)
    a, ta = R.forward(w, config, src, tgt, return_trace=True)
    b, tb = R.forward(w, config, longer, tgt, return_trace=True)
    assert_close(b, a, SELF_FLOAT64, "logits")
    assert_close(tb["encoder.output"][0, :5], ta["encoder.output"][0, :5], SELF_FLOAT64, "memory row 0")
    assert_close(tb["encoder.output"][1, :3], ta["encoder.output"][1, :3], SELF_FLOAT64, "memory row 1")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_decoder_is_causal(variant):
    config = VARIANTS[variant]
    w = random_weights(config, 5)
    src, tgt = src_tgt(config, batch=1, src_len=5, tgt_len=6, tgt_lengths=[6])
    changed = tgt.copy()
    changed[0, 4] = 3 if tgt[0, 4] != 3 else 4
    a = R.forward(w, config, src, tgt)
    b = R.forward(w, config, src, changed)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_explicit_masks_equal_derived_ones_and_matter():
    config = TINY
    w = random_weights(config, 6)
    src, tgt = src_tgt(config, batch=2, src_len=5, tgt_len=4)
    derived = R.forward(w, config, src, tgt)
    explicit = R.forward(w, config, src, tgt, make_src_mask(src, 0), make_tgt_mask(tgt, 0))
    np.testing.assert_array_equal(derived, explicit)
    everything = np.ones((1, 1, 1, 5), dtype=bool)
    assert not np.allclose(R.forward(w, config, src, tgt, src_mask=everything), derived)


def test_float32_weights_are_computed_in_float64():
    config32 = TINY.replace(dtype="float32")
    w32 = random_weights(config32, 7)
    w64 = {k: v.astype(np.float64) for k, v in w32.items()}
    src, tgt = src_tgt(config32)
    np.testing.assert_array_equal(R.forward(w32, config32, src, tgt), R.forward(w64, TINY, src, tgt))


def test_encode_matches_forward_trace():
    config = TINY
    w = random_weights(config, 8)
    src, tgt = src_tgt(config)
    _, trace = R.forward(w, config, src, tgt, return_trace=True)
    np.testing.assert_array_equal(R.encode(w, config, src), trace["encoder.output"])
