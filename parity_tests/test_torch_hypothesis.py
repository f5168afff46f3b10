"""Hypothesis-generated configurations and inputs: torch_impl vs the reference in float64, every
traced intermediate and the fast-path logits. Small examples, bounded by the suite's profile."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402

from parity_tests.strategies import cases  # noqa: E402
from shared.tolerances import assert_close, assert_trace_close, bound_for  # noqa: E402
from parity_tests.torch_support import build, run_logits, run_trace  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402


@given(cases())
def test_random_configs_match_reference_float64(case):
    config, src, tgt, seed = case
    weights = random_weights(config, seed)
    ref_logits, ref_trace = R.forward(weights, config, src, tgt, return_trace=True)
    model = build(config, weights)
    bound = bound_for("float64", "torch:reference")
    _, trace = run_trace(model, src, tgt)
    assert_trace_close(trace, ref_trace, bound)
    assert_close(run_logits(model, src, tgt), ref_logits, bound, "logits (fast path)")
    assert np.isfinite(ref_logits).all()
