"""Model behaviour every backend shares: dropout only in training, encode/decode/generator equal the
call, derived and explicit masks, causality, all-padding rows, sublayer names and dtypes; dropout
also inside tf.function. (Every compiled mode's numbers: test_parity.py.)
Framework-only behaviour: test_torch_only.py, test_tf_only.py."""
import numpy as np
import pytest

from parity_tests.backends import EAGER, backends, dtype_name, eager_of
from shared import TransformerConfig
from shared import make_src_mask as np_src_mask, make_tgt_mask as np_tgt_mask
from shared import reference as R
from shared.batches import src_tgt
from shared.tolerances import assert_close, bound_for
from shared.weights import random_weights

TINY = TransformerConfig.preset("tiny")  # dropout 0.1


# Dropout in a graph (tf.function) too; XLA is left to test_parity (compiling costs seconds a case).
DROPOUT = ([pytest.param(False, *p.values, id=f"plain-{p.id}")
            for p in backends(EAGER + ("tf-function",), cpu_only=True)]
           + [pytest.param(True, *p.values, id=f"trace-{p.id}") for p in backends(EAGER, cpu_only=True)])


@pytest.mark.parametrize("return_trace, backend", DROPOUT)
def test_dropout_only_in_training(return_trace, backend):
    config = TINY.replace(dtype="float64")
    model = backend.cached(config)
    src, tgt = src_tgt(config, batch=2, src_len=6, tgt_len=5)
    if return_trace:
        logits = lambda training: backend.trace(model, src, tgt, training=training)[0]  # noqa: E731
    else:
        logits = lambda training: backend.logits(model, src, tgt, training=training)  # noqa: E731
    a, b = logits(False), logits(False)
    np.testing.assert_array_equal(a, b)
    bound = bound_for("float64", backend.pair)
    assert_close(a, R.forward(random_weights(config, 0), config, src, tgt), bound)
    if backend.compiled:  # the graph's eval logits against eager's
        assert_close(a, eager_of(backend).logits(model, src, tgt), bound, "graph vs eager")
    c, d = logits(True), logits(True)
    assert np.isfinite(c).all()
    assert not np.allclose(c, a) and not np.allclose(c, d)
    np.testing.assert_array_equal(logits(False), a)  # back to eval: deterministic again


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_no_dropout_config_trains_like_eval(backend):
    """With dropout 0 the mode changes nothing, to the bit, in every intermediate: compared on the
    traced pass, which runs the same modules in both modes (torch's untraced eval pass without
    gradients runs on the weights kept for inference, the same to rounding only:
    test_inference_forward_torch_only.py)."""
    config = TINY.replace(dtype="float64", dropout=0.0)
    model = backend.cached(config)
    src, tgt = src_tgt(config)
    _, trained = backend.trace(model, src, tgt, training=True)
    _, evaluated = backend.trace(model, src, tgt)
    assert trained.keys() == evaluated.keys()
    for name in trained:
        np.testing.assert_array_equal(trained[name], evaluated[name], name)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_encode_decode_generator_equal_call(dtype, backend):
    config = TINY.replace(dtype=dtype)
    model = backend.cached(config, 1)
    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=5, src_lengths=[7, 0, 2])
    memory, logits, whole = backend.pieces(model, src, tgt)
    assert memory.shape == (3, 7, config.d_model) and logits.dtype == dtype
    np.testing.assert_array_equal(logits, whole)
    assert_close(memory, R.encode(random_weights(config, 1), config, src), bound_for(dtype, backend.pair),
                 "memory")


@pytest.mark.parametrize("backend", backends())
def test_derived_masks_equal_shared_masks(backend):
    src, tgt = src_tgt(TINY, batch=3, src_len=6, tgt_len=4)
    src_mask, tgt_mask = backend.make_masks(src, tgt, 0)
    np.testing.assert_array_equal(src_mask, np_src_mask(src, 0))
    np.testing.assert_array_equal(tgt_mask, np_tgt_mask(tgt, 0))


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_explicit_masks_equal_derived_ones_and_matter(backend):
    config = TINY.replace(dtype="float64")
    model = backend.cached(config, 2)
    src, tgt = src_tgt(config)
    derived = backend.logits(model, src, tgt)
    explicit = backend.logits(model, src, tgt, src_mask=np_src_mask(src, 0), tgt_mask=np_tgt_mask(tgt, 0))
    np.testing.assert_array_equal(derived, explicit)
    everything = np.ones((1, 1, 1, src.shape[1]), bool)
    assert not np.allclose(backend.logits(model, src, tgt, src_mask=everything), derived)


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_decoder_is_causal(backend):
    config = TINY.replace(dtype="float64")
    model = backend.cached(config, 5)
    src, tgt = src_tgt(config, batch=1, src_len=5, tgt_len=6, tgt_lengths=[6])
    changed = tgt.copy()
    changed[0, 4] = 3 if tgt[0, 4] != 3 else 4
    a, b = backend.logits(model, src, tgt), backend.logits(model, src, changed)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("backend", backends())
def test_all_padding_rows_are_zero_and_finite(backend):
    config = TINY.replace(dtype="float32", norm_first=False, norm_style="standard")
    model = backend.cached(config, 3)
    src, tgt = src_tgt(config, batch=2, src_len=5, tgt_len=4, src_lengths=[5, 0], tgt_lengths=[4, 0])
    _, trace = backend.trace(model, src, tgt)
    for name, value in trace.items():
        assert np.isfinite(value).all(), name
    for name in ("encoder.layers.0.self_attn.weights", "decoder.layers.0.self_attn.weights",
                 "decoder.layers.1.cross_attn.weights"):
        assert (trace[name][1] == 0).all(), name
    src_keys = np.broadcast_to(np_src_mask(src, 0), trace["decoder.layers.0.cross_attn.weights"].shape)
    assert (trace["decoder.layers.0.cross_attn.weights"][~src_keys] == 0).all()  # exactly zero


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_sublayers_and_dtypes(backend):
    """The mirrored module tree: the same sublayer names, every weight in the config dtype, the
    positional table too, and the config's norm eps (never the framework default)."""
    config = TINY.replace(dtype="float64")
    model = backend.cached(config)
    for name in ("src_embed", "tgt_embed", "positional", "encoder", "decoder", "generator", "config"):
        assert hasattr(model, name), name
    weights = list(model.parameters()) if backend.framework == "torch" else model.weights
    assert weights and all(dtype_name(v.dtype) == "float64" for v in weights)
    assert dtype_name(model.positional.table.dtype) == "float64"
    layer = model.decoder.layers[1]
    for name in ("self_attn", "self_attn_norm", "cross_attn", "cross_attn_norm", "ffn", "ffn_norm"):
        assert hasattr(layer, name), name
    assert model.encoder.final_norm is not None  # tiny is pre-norm
    assert layer.self_attn_norm.eps == config.norm_eps  # never Keras' 1e-3 nor torch's 1e-5
