"""Gradients of every backend in float64, on a tiny model with an all-padding row: autodiff against
central finite differences of the NumPy reference, for every element of a few weights of every kind
of layer (eager); the compiled modes (tf.function, XLA) against eager; with and without the trace
(torch: the explicit and the SDPA paths) the same. (torch's own ``gradcheck``: test_torch_only.py.)"""
from functools import lru_cache

import numpy as np
import pytest

from parity_tests.backends import backends, eager_of
from shared import TransformerConfig
from shared import reference as R
from shared.batches import src_tgt
from shared.tolerances import FLOAT64, assert_close
from shared.weights import random_weights

CONFIG = TransformerConfig(src_vocab=6, tgt_vocab=7, d_model=4, n_heads=2, d_ff=6, n_encoder_layers=1,
                           n_decoder_layers=1, max_len=8, norm_first=True, norm_style="annotated",
                           dropout=0.0, dtype="float64")
CONFIGS = {"pre-annotated": CONFIG, "post-standard": CONFIG.replace(norm_first=False, norm_style="standard")}
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


@lru_cache(maxsize=None)
def _numeric(variant: str) -> dict[str, np.ndarray]:
    """Central differences of the reference's ``sum(logits * probe)``, computed once per config for
    every backend."""
    config = CONFIGS[variant]
    weights, src, tgt, probe = _setup(config)

    def scalar(w):
        return float(np.sum(R.forward(w, config, src, tgt) * probe))

    out = {}
    for name in (n for n in CHECKED if n in weights):
        numeric = np.zeros_like(weights[name])
        for index in np.ndindex(numeric.shape):
            w = dict(weights)
            w[name] = weights[name].copy()
            w[name][index] += EPS
            up = scalar(w)
            w[name][index] -= 2 * EPS
            numeric[index] = (up - scalar(w)) / (2 * EPS)
        out[name] = numeric
    return out


@pytest.mark.parametrize("backend", backends(cpu_only=True))
@pytest.mark.parametrize("variant", CONFIGS)
def test_gradients_match_finite_differences_of_the_reference(variant, backend):
    config = CONFIGS[variant]
    weights, src, tgt, probe = _setup(config)
    grads = backend.probe_gradients(backend.cached(config), src, tgt, probe)
    assert list(grads) == list(weights)  # every canonical name, in schema order
    for name, numeric in _numeric(variant).items():
        assert np.isfinite(grads[name]).all(), name
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("backend", backends(("tf-function", "tf-xla"), cpu_only=True))
def test_compiled_gradients_equal_eager_gradients(backend):
    weights, src, tgt, probe = _setup(CONFIG)
    model = backend.cached(CONFIG)
    eager = eager_of(backend).probe_gradients(model, src, tgt, probe)
    compiled = backend.probe_gradients(model, src, tgt, probe)
    for name in weights:
        assert_close(compiled[name], eager[name], FLOAT64, name)


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_gradients_with_and_without_the_trace_are_the_same(backend):
    """torch: the explicit attention path (trace) and the SDPA path; TF: one path, so bit for bit."""
    _, src, tgt, _ = _setup(CONFIG)
    probe = np.random.default_rng(1).normal(size=(2, 3, CONFIG.tgt_vocab))
    model = backend.cached(CONFIG)
    plain = backend.probe_gradients(model, src, tgt, probe)
    traced = backend.probe_gradients(model, src, tgt, probe, return_trace=True)
    for name, grad in plain.items():
        assert np.isfinite(grad).all(), name
        assert_close(grad, traced[name], FLOAT64, name)
        if backend.kind == "tf-eager":
            np.testing.assert_array_equal(grad, traced[name], err_msg=name)
