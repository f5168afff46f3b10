"""Decoding behaviour only tf_impl has: its modes (eager, tf.function, XLA) against each other,
the measured default mode, the mode arguments, and the compiled loops on a GPU. The contract both
backends share is test_decoding.py."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from parity_tests.decoding_backends import TF_MODES  # noqa: E402
from parity_tests.decoding_cases import (ALPHAS, BEAM, MAX_LEN, beams, config64, greedy,  # noqa: E402
                                         model_for, reference_decodes, sources, weights_for)
from parity_tests.test_decoding import MODEL64, SRC, W64, assert_same_beams, assert_same_greedy  # noqa: E402
from parity_tests.tf_support import DEVICES  # noqa: E402  (importing it switches TF32 off)
from shared import reference as R  # noqa: E402
from shared.tolerances import bound_for  # noqa: E402
from tf_impl import decoding  # noqa: E402


@pytest.mark.parametrize("device", DEVICES[1:] or [pytest.param("/GPU:0", marks=pytest.mark.skip("no GPU"))])
def test_float64_parity_on_gpu(device):
    """The compiled loops (tf.function and XLA) on a GPU: a fresh model, traced there."""
    name, seed = "tiny-post-final-norm", 1
    config = config64(name)
    want_greedy, want_beams = reference_decodes(name, seed)
    tol = bound_for("float64", "tf:reference")
    with tf.device(device):
        model = tf_impl.Transformer(config)
        model.import_weights(weights_for(config, seed))
        for mode in ("tf-function", "tf-xla"):
            src, kw = sources(config, seed), TF_MODES[mode]
            assert_same_greedy(tf_impl.greedy_decode(model, src, MAX_LEN, **kw), want_greedy, tol, mode)
            got = {alpha: tf_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True, **kw)
                   for alpha in ALPHAS}
            assert_same_beams(got, want_beams, tol, f"{device} {mode}")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compiled_and_eager_give_the_same_tokens(dtype):
    """Eager, tf.function and XLA: identical tokens and lengths, scores equal to rounding. Not bit
    for bit: in a tf.function TF's graph optimizer (grappler's constant folding) rewrites divisions
    by constants (the layer norm's, the length penalty's) into multiplications by the rounded
    reciprocal, as it does for the model's plain forward pass; XLA compiles its own kernels."""
    name, seed = ("tiny-post-standard", 0) if dtype == "float64" else ("tiny-pre-annotated", 1)
    tol = bound_for(dtype, "tf:reference")
    eager_greedy, eager_beams = greedy("tf-eager", name, dtype, seed), beams("tf-eager", name, dtype, seed)
    for mode in ("tf-function", "tf-xla"):
        where = f"{mode} vs eager, {dtype}"
        assert_same_greedy(greedy(mode, name, dtype, seed), eager_greedy, tol, where)
        assert_same_beams(beams(mode, name, dtype, seed), eager_beams, tol, where)


@pytest.mark.parametrize("use_cache, name", [(True, "tiny-post-standard"), (False, "tiny-pre-annotated")])
def test_default_is_the_measured_mode(use_cache, name):
    """compiled=True by default, with XLA where it was measured to help (decoding.JIT_COMPILE)."""
    model = model_for("tf-eager", name, "float64", 0)
    mode = "tf-xla" if decoding.JIT_COMPILE[use_cache] else "tf-function"
    for x, y in zip(tf_impl.greedy_decode(model, sources(config64(name), 0), MAX_LEN, use_cache=use_cache),
                    greedy(mode, name, "float64", 0, use_cache)):
        np.testing.assert_array_equal(x, y)


def test_mode_arguments():
    model = model_for("tf-eager", "tiny-pre-annotated", "float64", 0)
    with pytest.raises(ValueError, match=r"jit_compile: XLA compiles the tf.function of the loop"):
        tf_impl.greedy_decode(model, SRC, 5, compiled=False, jit_compile=True)
    with pytest.raises(ValueError, match=r"observe: a Python hook called once a step"):
        tf_impl.beam_search(model, SRC, 5, observe=print)
    with pytest.raises(RuntimeError, match=r"call them eagerly"):
        tf.function(lambda: tf_impl.greedy_decode(model, tf.constant(SRC), 5))()
    # The model-type check of test_decoding, here with the reference model of the same weights.
    with pytest.raises(TypeError, match=r"model: expected a tf_impl.Transformer, got _?Model"):
        tf_impl.greedy_decode(R.Model(W64, MODEL64), SRC, 5)
