"""torch_impl vs tf_impl directly, on identical random weights: every traced intermediate, over the
parity matrix, in float64 and float32. (Each backend is also checked against the float64 reference
in its own test module; this one proves the two frameworks agree with each other.)"""
from functools import lru_cache

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from parity_tests.matrix import CASES, case  # noqa: E402
from shared.tolerances import assert_trace_close, bound_for  # noqa: E402
from parity_tests.torch_support import build, run_trace  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402

PARAMS = [pytest.param(v, s, dtype, id=f"{v}/{s}-{dtype}") for v, s in CASES for dtype in ("float64", "float32")]


@lru_cache(maxsize=1)
def _weights(variant: str, shape: str, dtype: str):
    config, src, tgt = case(variant, shape, dtype)
    return config, src, tgt, random_weights(config, seed=1)


def _tf_trace(config, weights, src, tgt):
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    logits, trace = model(src, tgt, return_trace=True)
    return np.asarray(logits), {name: np.asarray(value) for name, value in trace.items()}


@pytest.mark.parametrize("variant, shape, dtype", PARAMS)
def test_torch_and_tf_agree_on_every_intermediate(variant, shape, dtype):
    config, src, tgt, weights = _weights(variant, shape, dtype)
    _, torch_trace = run_trace(build(config, weights), src, tgt)
    _, tf_trace = _tf_trace(config, weights, src, tgt)
    assert list(torch_trace) == list(tf_trace) == R.trace_names(config)
    assert_trace_close(torch_trace, tf_trace, bound_for(dtype, "torch:tf"))


def test_exported_weights_cross_over_bit_exactly():
    """torch -> canonical -> TF -> canonical -> torch leaves every tensor byte-identical."""
    config, _, _, weights = _weights("tiny-shared-tied-post", "b3-padded-src-longer", "float32")
    torch_model = build(config, weights)
    tf_model = tf_impl.Transformer(config)
    tf_model.import_weights(torch_model.export_weights())
    back = build(config, tf_model.export_weights()).export_weights()
    assert set(back) == set(weights)
    for name, value in weights.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes(), name
