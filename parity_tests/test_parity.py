"""Every backend vs the float64 NumPy reference over the parity matrix: every traced intermediate and
the plain call's logits, on identical random weights (every tensor random), per dtype and device.

Eager backends (torch, TF eager) run the whole matrix; the compiled TF modes (tf.function, XLA) run
three representative cases (padding rows, shared+tied post-norm, base) against the reference and
against TF eager, with the same bound: XLA fuses and reorders. (torch vs TF directly:
test_cross_parity.py; ``predict``: test_tf_only.py.)
"""
from functools import lru_cache

import numpy as np
import pytest

from parity_tests.backends import BACKENDS, COMPILED, EAGER, cached_weights, eager_of
from parity_tests.matrix import CASES, case
from shared import reference as R
from shared.tolerances import assert_close, assert_trace_close, bound_for

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
