"""torch_impl vs tf_impl directly, on identical random weights: every traced intermediate, over the
parity matrix, in float64 and float32. (Each backend is also checked against the float64 reference
in test_parity.py; this one proves the two frameworks agree with each other.)"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")

from parity_tests.backends import Backend  # noqa: E402
from parity_tests.matrix import CASES, case  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.tolerances import assert_trace_close, bound_for  # noqa: E402
from shared.weights import random_weights  # noqa: E402

PARAMS = [pytest.param(v, s, dtype, id=f"{v}/{s}-{dtype}")
          for v, s in CASES for dtype in ("float64", "float32")]
TORCH, TF = Backend("torch", "eager", "cpu"), Backend("tf", "eager", "/CPU:0")
SEED = 0  # test_parity's weights and cached models: in one process, the models are built once


@pytest.mark.parametrize("variant, shape, dtype", PARAMS)
def test_torch_and_tf_agree_on_every_intermediate(variant, shape, dtype):
    config, src, tgt = case(variant, shape, dtype)
    _, torch_trace = TORCH.trace(TORCH.cached(config, SEED), src, tgt)
    _, tf_trace = TF.trace(TF.cached(config, SEED), src, tgt)
    assert list(torch_trace) == list(tf_trace) == R.trace_names(config)
    assert_trace_close(torch_trace, tf_trace, bound_for(dtype, "torch:tf"))


def test_exported_weights_cross_over_bit_exactly():
    """torch -> canonical -> TF -> canonical -> torch leaves every tensor byte-identical."""
    config, _, _ = case("tiny-shared-tied-post", "b3-padded-src-longer", "float32")
    weights = TORCH.cached(config, SEED).export_weights()
    assert all(weights[n].tobytes() == w.tobytes() for n, w in random_weights(config, SEED).items())
    tf_model = TF.build(config, weights)
    back = TORCH.build(config, tf_model.export_weights()).export_weights()
    assert set(back) == set(weights)
    for name, value in weights.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes(), name
