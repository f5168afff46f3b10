"""Gradients of tf_impl in float64: tf.GradientTape against central finite differences of the NumPy
reference, on a tiny model with an all-padding row; and the XLA gradient against the eager one."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from shared.batches import src_tgt  # noqa: E402
from parity_tests.tf_support import build  # noqa: E402
from shared.tolerances import FLOAT64, assert_close  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl.weights_io import variable_table  # noqa: E402

CONFIG = TransformerConfig(src_vocab=6, tgt_vocab=7, d_model=4, n_heads=2, d_ff=6, n_encoder_layers=1,
                           n_decoder_layers=1, max_len=8, norm_first=True, norm_style="annotated",
                           dropout=0.0, dtype="float64")
# A few weights from every kind of layer; every element of each is perturbed.
CHECKED = ["src_embed.embeddings", "tgt_embed.embeddings", "encoder.layers.0.self_attn.query.kernel",
           "encoder.layers.0.self_attn_norm.gamma", "decoder.layers.0.cross_attn.key.kernel",
           "decoder.layers.0.cross_attn.value.bias", "decoder.layers.0.ffn.inner.kernel",
           "decoder.final_norm.beta", "generator.kernel", "generator.bias"]
EPS = 1e-6


def _setup(config):
    weights = random_weights(config, 0)
    # Row 1: an all-padding source and target; row 0 full, so both zero and non-zero rows are hit.
    src, tgt = src_tgt(config, batch=2, src_len=4, tgt_len=3, src_lengths=[4, 0], tgt_lengths=[3, 0])
    probe = np.random.default_rng(0).normal(size=(2, 3, config.tgt_vocab))  # scalar = sum(logits * probe)
    return weights, src, tgt, probe


def _tape_gradients(model, src, tgt, probe, names):
    table = variable_table(model)
    with tf.GradientTape() as tape:
        scalar = tf.reduce_sum(model(src, tgt) * probe)
    grads = tape.gradient(scalar, [table[n] for n in names])
    return {n: tf.convert_to_tensor(g).numpy() for n, g in zip(names, grads)}  # gathers give IndexedSlices


@pytest.mark.parametrize("config", [CONFIG, CONFIG.replace(norm_first=False, norm_style="standard")],
                         ids=["pre-annotated", "post-standard"])
def test_gradients_match_finite_differences_of_the_reference(config):
    weights, src, tgt, probe = _setup(config)
    names = [n for n in CHECKED if n in weights]
    grads = _tape_gradients(build(config, weights), src, tgt, probe, names)

    def scalar(w):
        return float(np.sum(R.forward(w, config, src, tgt) * probe))

    for name in names:
        numeric = np.zeros_like(weights[name])
        for index in np.ndindex(numeric.shape):
            w = dict(weights)
            w[name] = weights[name].copy()
            w[name][index] += EPS
            up = scalar(w)
            w[name][index] -= 2 * EPS
            numeric[index] = (up - scalar(w)) / (2 * EPS)
        assert np.isfinite(grads[name]).all(), name
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_xla_gradients_equal_eager_gradients():
    weights, src, tgt, probe = _setup(CONFIG)
    model = build(CONFIG, weights)
    names = list(weights)
    eager = _tape_gradients(model, src, tgt, probe, names)
    compiled = tf.function(lambda: _tape_gradients_graph(model, src, tgt, probe, names), jit_compile=True)()
    for name, value in zip(names, compiled):
        assert_close(tf.convert_to_tensor(value).numpy(), eager[name], FLOAT64, name)


def _tape_gradients_graph(model, src, tgt, probe, names):
    table = variable_table(model)
    with tf.GradientTape() as tape:
        scalar = tf.reduce_sum(model(src, tgt) * probe)
    return tape.gradient(scalar, [table[n] for n in names])
