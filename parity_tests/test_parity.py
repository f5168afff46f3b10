"""Every backend vs the float64 NumPy reference over the parity matrix: every traced intermediate and
the plain call's logits, on identical random weights (every tensor random), per dtype and device;
and torch vs TF directly, on the same matrix.

Eager backends (torch, TF eager) run the whole matrix; the compiled TF modes (tf.function, XLA) run
three representative cases (padding rows, shared+tied post-norm, base) against the reference and
against TF eager, with the same bound: XLA fuses and reorders. (``predict``: test_tf_only.py.)

The torch-vs-TF tests live here, not in a module of their own, because they read the same cached
models (`Backend.cached`, seed 0): under ``--dist loadfile`` a module runs whole on one worker, so a
separate module would build every model again, the base preset's four among them (about 9 s).
"""
from functools import lru_cache

import numpy as np
import pytest

from parity_tests.backends import BACKENDS, COMPILED, EAGER, Backend, cached_weights, eager_of
from parity_tests.matrix import CASES, case
from shared import reference as R
from shared.tolerances import assert_close, assert_trace_close, bound_for
from shared.weights import random_weights

# Ordered case -> dtype -> backend, so consecutive tests reuse the cached weights, model and reference.
PARAMS = [pytest.param(v, s, dtype, b, id=f"{v}/{s}-{dtype}-{b.id}")
          for v, s in CASES for dtype in ("float64", "float32") for b in BACKENDS if b.kind in EAGER]
MODE_CASES = [("tiny-pre-annotated", "b3-all-padding-row", "float64"),
              ("tiny-shared-tied-post", "b3-padded-src-longer", "float32"),
              ("base", "b2-tgt-longer", "float32")]
MODE_PARAMS = [pytest.param(v, s, dtype, b, id=f"{v}/{s}-{dtype}-{b.id}")
               for v, s, dtype in MODE_CASES for b in BACKENDS if b.kind in COMPILED]


@lru_cache(maxsize=2)
def _reference(variant: str, shape: str, dtype: str):
    config, src, tgt = case(variant, shape, dtype)
    weights = cached_weights(config, 0)
    logits, trace = R.forward(weights, config, src, tgt, return_trace=True)
    return config, src, tgt, logits, trace


def _check_trace(backend, config, trace, ref_trace, bound):
    assert list(trace) == R.trace_names(config)
    for name, value in trace.items():
        assert value.dtype == config.dtype, f"{name}: dtype {value.dtype}, expected {config.dtype}"
    assert_trace_close(trace, ref_trace, bound)


@pytest.mark.parametrize("variant, shape, dtype, backend", PARAMS)
def test_trace_and_logits_match_reference(variant, shape, dtype, backend):
    config, src, tgt, ref_logits, ref_trace = _reference(variant, shape, dtype)
    model = backend.cached(config)
    bound = bound_for(dtype, backend.pair)
    logits, trace = backend.trace(model, src, tgt)
    _check_trace(backend, config, trace, ref_trace, bound)
    plain = backend.logits(model, src, tgt)
    assert plain.dtype == config.dtype
    assert_close(plain, ref_logits, bound, "logits (plain call)")
    if backend.framework == "torch":  # the plain call takes SDPA, the trace the explicit path
        assert_close(plain, logits, bound, "logits (fast path vs explicit path)")
    else:  # one attention path: the plain call computes the same logits, bit for bit
        np.testing.assert_array_equal(plain, logits)


@pytest.mark.parametrize("variant, shape, dtype, backend", MODE_PARAMS)
def test_compiled_modes_match_reference_and_eager(variant, shape, dtype, backend):
    """Every intermediate in the compiled mode against the reference and against eager; the plain
    call's logits against the traced ones."""
    config, src, tgt, _, ref_trace = _reference(variant, shape, dtype)
    model = backend.cached(config)
    bound = bound_for(dtype, backend.pair)
    _, trace = backend.trace(model, src, tgt)
    _check_trace(backend, config, trace, ref_trace, bound)
    _, eager = eager_of(backend).trace(model, src, tgt)
    assert_trace_close(trace, eager, bound)
    assert_close(backend.logits(model, src, tgt), trace["logits"], bound, f"{backend.mode} logits")


# -- torch vs TF directly ------------------------------------------------------------------------
CROSS_PARAMS = [pytest.param(v, s, dtype, id=f"{v}/{s}-{dtype}")
                for v, s in CASES for dtype in ("float64", "float32")]
TORCH, TF = Backend("torch", "eager", "cpu"), Backend("tf", "eager", "/CPU:0")
needs_both = pytest.mark.skipif(not {"torch", "tf"} <= {b.framework for b in BACKENDS},
                                reason="needs both torch and TensorFlow")


@needs_both
@pytest.mark.parametrize("variant, shape, dtype", CROSS_PARAMS)
def test_torch_and_tf_agree_on_every_intermediate(variant, shape, dtype):
    """Each backend is checked against the reference above; this proves the two frameworks agree
    with each other, within the torch:tf bound."""
    config, src, tgt = case(variant, shape, dtype)
    _, torch_trace = TORCH.trace(TORCH.cached(config), src, tgt)
    _, tf_trace = TF.trace(TF.cached(config), src, tgt)
    assert list(torch_trace) == list(tf_trace) == R.trace_names(config)
    assert_trace_close(torch_trace, tf_trace, bound_for(dtype, "torch:tf"))


@needs_both
def test_exported_weights_cross_over_bit_exactly():
    """torch -> canonical -> TF -> canonical -> torch leaves every tensor byte-identical."""
    config, _, _ = case("tiny-shared-tied-post", "b3-padded-src-longer", "float32")
    weights = TORCH.cached(config).export_weights()
    assert all(weights[n].tobytes() == w.tobytes() for n, w in random_weights(config, 0).items())
    tf_model = TF.build(config, weights)
    back = TORCH.build(config, tf_model.export_weights()).export_weights()
    assert set(back) == set(weights)
    for name, value in weights.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes(), name
