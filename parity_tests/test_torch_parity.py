"""torch_impl vs the float64 NumPy reference over the parity matrix: every traced intermediate,
on identical random weights (every tensor random), per dtype and device."""
from functools import lru_cache

import pytest

pytest.importorskip("torch")

from parity_tests.matrix import CASES, case  # noqa: E402
from shared.tolerances import assert_close, assert_trace_close, bound_for  # noqa: E402
from parity_tests.torch_support import DEVICES, build, run_logits, run_trace  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402

# Ordered case -> dtype -> device, so consecutive tests reuse the cached weights and reference.
PARAMS = [pytest.param(v, s, dtype, device, id=f"{v}/{s}-{dtype}-{device}")
          for v, s in CASES for dtype in ("float64", "float32") for device in DEVICES]


@lru_cache(maxsize=2)
def _reference(variant: str, shape: str, dtype: str):
    config, src, tgt = case(variant, shape, dtype)
    weights = random_weights(config, seed=0)
    logits, trace = R.forward(weights, config, src, tgt, return_trace=True)
    return config, src, tgt, weights, logits, trace


@pytest.mark.parametrize("variant, shape, dtype, device", PARAMS)
def test_trace_matches_reference(variant, shape, dtype, device):
    config, src, tgt, weights, _, ref_trace = _reference(variant, shape, dtype)
    model = build(config, weights, device)
    _, trace = run_trace(model, src, tgt, device)
    assert list(trace) == R.trace_names(config)
    for name, value in trace.items():
        assert value.dtype == config.dtype, f"{name}: dtype {value.dtype}, expected {config.dtype}"
    assert_trace_close(trace, ref_trace, bound_for(dtype, "torch:reference"))


@pytest.mark.parametrize("variant, shape, dtype, device", PARAMS)
def test_fast_path_logits_match_reference_and_explicit_path(variant, shape, dtype, device):
    config, src, tgt, weights, ref_logits, _ = _reference(variant, shape, dtype)
    model = build(config, weights, device)
    bound = bound_for(dtype, "torch:reference")
    fast = run_logits(model, src, tgt, device)
    explicit, _ = run_trace(model, src, tgt, device)
    assert_close(fast, ref_logits, bound, "logits (fast path)")
    assert_close(fast, explicit, bound, "logits (fast path vs explicit path)")
