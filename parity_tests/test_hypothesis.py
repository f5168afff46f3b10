"""Hypothesis-generated configurations and inputs: every eager backend vs the reference in float64,
every traced intermediate and the plain call's logits (torch: the SDPA path). Small examples,
bounded by the suite's profile; the same examples for every backend."""
import numpy as np
import pytest
from hypothesis import given, settings

from parity_tests.backends import backends
from parity_tests.strategies import cases
from shared import reference as R
from shared.tolerances import assert_close, assert_trace_close, bound_for
from shared.weights import random_weights


# Examples per backend: torch builds a model in ~0.05 s, TF in ~0.4 s on 2 cores (a Keras model
# per example), so TF draws the first half of the same stream, which keeps the suite in its time.
EXAMPLES = {"torch": 60, "tf": 30}


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_random_configs_match_reference_float64(backend):
    @settings(max_examples=EXAMPLES[backend.framework])
    @given(case=cases())
    def matches_the_reference(case):
        config, src, tgt, seed = case
        weights = random_weights(config, seed)
        ref_logits, ref_trace = R.forward(weights, config, src, tgt, return_trace=True)
        model = backend.build(config, weights)
        bound = bound_for("float64", backend.pair)
        _, trace = backend.trace(model, src, tgt)
        assert_trace_close(trace, ref_trace, bound)
        assert_close(backend.logits(model, src, tgt), ref_logits, bound, "logits (plain call)")
        assert np.isfinite(ref_logits).all()

    matches_the_reference()
