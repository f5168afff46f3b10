"""tf_impl vs the float64 NumPy reference over the parity matrix: every traced intermediate, on
identical random weights (every tensor random), per dtype and device, run eagerly.
(tf.function, XLA and predict are compared in test_tf_modes.py.)"""
from functools import lru_cache

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from parity_tests.matrix import CASES, case  # noqa: E402
from parity_tests.tf_support import DEVICES, build, run_logits, run_trace  # noqa: E402
from shared.tolerances import assert_close, assert_trace_close, bound_for  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402

# Ordered case -> dtype -> device, so consecutive tests reuse the cached weights, model and reference.
PARAMS = [pytest.param(v, s, dtype, device, id=f"{v}/{s}-{dtype}-{device}")
          for v, s in CASES for dtype in ("float64", "float32") for device in DEVICES]


@lru_cache(maxsize=2)
def _reference(variant: str, shape: str, dtype: str):
    config, src, tgt = case(variant, shape, dtype)
    weights = random_weights(config, seed=0)
    logits, trace = R.forward(weights, config, src, tgt, return_trace=True)
    return config, src, tgt, weights, logits, trace


@lru_cache(maxsize=1)
def _model(variant: str, dtype: str):
    config, _, _, weights, _, _ = _reference(*next((v, s) for v, s in CASES if v == variant), dtype)
    return build(config, weights)


@pytest.mark.parametrize("variant, shape, dtype, device", PARAMS)
def test_trace_matches_reference(variant, shape, dtype, device):
    config, src, tgt, _, ref_logits, ref_trace = _reference(variant, shape, dtype)
    model = _model(variant, dtype)
    trace = run_trace(model, src, tgt, device)
    assert list(trace) == R.trace_names(config)
    for name, value in trace.items():
        assert value.dtype == config.dtype, f"{name}: dtype {value.dtype}, expected {config.dtype}"
    assert_trace_close(trace, ref_trace, bound_for(dtype, "tf:reference"))
    # The plain call (no trace) computes the same logits, bit for bit.
    np.testing.assert_array_equal(run_logits(model, src, tgt, device), trace["logits"])
    assert_close(trace["logits"], ref_logits, bound_for(dtype, "tf:reference"), "logits")
