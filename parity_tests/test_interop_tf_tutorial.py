"""The TensorFlow text tutorial's Transformer, built with Keras 3 with random weights in every
variable, saved with ``save_weights``, imported (`shared.importers.from_tf_tutorial`, ``twins convert
--from tf-tutorial``), and run in the reference, torch_impl and tf_impl against the source model's
own logits and its greedy loop.

Heads of width ``key_dim = d_model`` = 16 in the float64 setting: Keras' attention multiplies
by ``1/sqrt(key_dim)`` cast from a Python float through float32 (``tf.cast`` of a Python scalar),
even in a float64 model; for a power of 4 that scale is exact, otherwise the source itself differs
from float64 arithmetic by ~1e-8 relative (`test_the_float64_source_rounds_its_attention_scale`).

Under Keras 3 the tutorial's padding mask reaches only the first self-attention of each stack
(`shared/importers/tf_tutorial.py`): parity is asserted on unpadded batches (the tutorial's
``Translator`` runs one unpadded sentence), and the padded difference is pinned as a fact.
"""
import functools
import warnings

import h5py
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")

from parity_tests import keras_source_models as K  # noqa: E402
from parity_tests.backends import Backend  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.importers import ImporterError, from_keras_hub, from_tf_tutorial, read_keras_file  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for, max_rel_diff  # noqa: E402
from tf_impl import decoding as tf_decoding  # noqa: E402
from torch_impl import decoding as torch_decoding  # noqa: E402
from twins.cli import main  # noqa: E402

# Keras warns that the tutorial's custom layers "destroy the mask information": that is the Keras 3
# behaviour this file documents.
pytestmark = pytest.mark.filterwarnings("ignore:Layer '.*' .* does not support masking:UserWarning")

# Dropout 0.1 and 0 take Keras' two attention paths (einsum + masked softmax; the fused
# dot_product_attention). Kept to two models: each costs seconds to build and run eagerly.
SETTINGS = {  # num_layers, d_model, num_heads, dff, vocabularies, dropout
    "1-layer-d16": dict(num_layers=1, d_model=16, num_heads=2, dff=24, input_vocab_size=11,
                        target_vocab_size=13, dropout_rate=0.1, dtype="float64"),
    "2-layers-d8-float32": dict(num_layers=2, d_model=8, num_heads=3, dff=12, input_vocab_size=12,
                                target_vocab_size=10, dropout_rate=0.0, dtype="float32"),
}
BOS, EOS = 2, 3  # the tutorial tokenizer's [START] and [END]
TORCH, TF = Backend("torch", "eager", "cpu"), Backend("tf", "eager", "/CPU:0")


@functools.lru_cache(maxsize=None)
def source(name: str, tmp_dir: str):
    """(Keras model, weights path, config, canonical weights); built, randomized, saved, imported."""
    args = dict(SETTINGS[name])
    dtype = args.pop("dtype")
    with K.float_policy(dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = K.TutorialTransformer(**args)
        model((np.ones((1, 2), np.int32), np.ones((1, 2), np.int32)))  # build every variable
    K.randomize(model, seed=sorted(SETTINGS).index(name))
    path = f"{tmp_dir}/{name}.weights.h5"
    model.save_weights(path)
    config, weights = from_tf_tutorial(read_keras_file(path).weights, bos_id=BOS, eos_id=EOS)
    return model, path, config, weights


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tutorial"))


def unpadded(config, batch=3, src_len=7, tgt_len=6, seed=0):
    """Ids without padding; the target starts with [START]."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, config.src_vocab, (batch, src_len))
    tgt = rng.integers(1, config.tgt_vocab, (batch, tgt_len))
    tgt[:, 0] = BOS
    return src, tgt


def keras_logits(model, src, tgt) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(model((src, tgt), training=False))


def bound(config, pair: str):
    return FLOAT64 if config.dtype == "float64" else bound_for("float32", pair)


# -- the mapping ----------------------------------------------------------------------------------
def test_the_config_says_what_the_tutorial_computes(tmp_dir):
    _, _, config, weights = source("1-layer-d16", tmp_dir)
    assert (config.d_model, config.n_heads, config.head_dim, config.d_ff) == (16, 2, 16, 24)
    assert (config.src_vocab, config.tgt_vocab, config.n_encoder_layers, config.n_decoder_layers) == (11, 13, 1, 1)
    assert (config.pe_layout, config.pe_timescale, config.embed_scale, config.max_len) == ("halves", "paper", True, 2048)
    assert (config.norm_first, config.final_norm, config.norm_eps, config.pad_id) == (False, False, 1e-3, 0)
    assert weights["encoder.layers.0.self_attn.query.kernel"].shape == (16, 32)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_logits_equal_the_source_model_in_all_three(name, tmp_dir):
    model, _, config, weights = source(name, tmp_dir)
    src, tgt = unpadded(config)
    expected = keras_logits(model, src, tgt)
    assert_close(R.forward(weights, config, src, tgt), expected, bound(config, "keras-source:reference"),
                 "reference logits")
    for backend, pair in ((TORCH, "keras-source:torch"), (TF, "keras-source:tf")):
        actual = backend.logits(backend.build(config, weights), src, tgt)
        assert_close(actual, expected, bound(config, pair), f"{backend.framework} logits")


def test_a_swapped_tensor_breaks_parity(tmp_dir):
    """Every variable is random, so an importer that swapped two would be caught."""
    model, _, config, weights = source("1-layer-d16", tmp_dir)
    src, tgt = unpadded(config)
    expected = keras_logits(model, src, tgt)
    for a, b in [("decoder.layers.0.cross_attn.query.kernel", "decoder.layers.0.cross_attn.key.kernel"),
                 ("encoder.layers.0.ffn_norm.gamma", "encoder.layers.0.self_attn_norm.gamma")]:
        swapped = {**weights, a: weights[b], b: weights[a]}
        assert max_rel_diff(R.forward(swapped, config, src, tgt), expected) > 1e-6, (a, b)


def test_greedy_tokens_equal_a_greedy_loop_on_the_source(tmp_dir):
    model, _, config, weights = source("1-layer-d16", tmp_dir)
    src, _ = unpadded(config, batch=4, seed=3)
    expected = K.source_greedy(lambda s, p: keras_logits(model, s, p)[:, -1], src, BOS, EOS,
                               config.pad_id, max_new=6)
    np.testing.assert_array_equal(R.greedy_decode(R.Model(weights, config), src, 6).tokens, expected)
    np.testing.assert_array_equal(
        torch_decoding.greedy_decode(TORCH.build(config, weights), src, 6).tokens, expected)
    np.testing.assert_array_equal(
        tf_decoding.greedy_decode(TF.build(config, weights), src, 6).tokens, expected)


def test_padded_batches_differ_under_keras_3(tmp_dir):
    """A fact of Keras 3, pinned: MultiHeadAttention strips its inputs' masks, so the tutorial's
    model stops masking padding after the first attention sublayer; the import masks padding
    everywhere (as Keras 2 did). If this starts to fail, Keras changed: update the importer's note."""
    model, _, config, weights = source("2-layers-d8-float32", tmp_dir)
    src, tgt = unpadded(config)
    src[:, 4:] = 0  # padded sources, unpadded targets: compare every position
    assert max_rel_diff(R.forward(weights, config, src, tgt), keras_logits(model, src, tgt)) > 1e-3


def test_the_float64_source_rounds_its_attention_scale():
    """Why the float64 settings use key_dim 4 or 16: with key_dim 8 Keras' float64 attention differs
    from float64 arithmetic by its scale's float32 rounding (1/sqrt(8) is inexact)."""
    with K.float_policy("float64"):
        mha = keras.layers.MultiHeadAttention(num_heads=1, key_dim=8)
        x = np.random.default_rng(0).normal(size=(1, 5, 8))
        keras_out = np.asarray(mha(x, x))
    w = {}
    for p in ("query", "key", "value"):
        dense = getattr(mha, f"_{p}_dense")
        w[f"a.{p}.kernel"], w[f"a.{p}.bias"] = dense.kernel.numpy()[:, 0], dense.bias.numpy()[0]
    w["a.output.kernel"], w["a.output.bias"] = mha._output_dense.kernel.numpy()[0], mha._output_dense.bias.numpy()
    exact, _ = R.attention(x, x, np.ones((1, 1, 1, 5), bool), w, "a", 1)
    assert 1e-12 < max_rel_diff(keras_out, exact) < 1e-6


# -- bad input ------------------------------------------------------------------------------------
def rewrite(path: str, out: str, drop: str | None = None, replace: tuple[str, np.ndarray] | None = None) -> str:
    """A copy of the weights file without one variable, or with one replaced."""
    with h5py.File(path, "r") as a, h5py.File(out, "w") as b:
        for key in a:
            a.copy(a[key], b, name=key)
        if drop:
            del b[drop]
        if replace:
            del b[replace[0]]
            b[replace[0]] = replace[1]
    return out


def test_a_missing_variable_is_named(tmp_dir):
    _, path, _, _ = source("1-layer-d16", tmp_dir)
    name = "decoder/dec_layers/decoder_layer/cross_attention/mha/key_dense/vars/1"
    bad = rewrite(path, f"{tmp_dir}/missing.weights.h5", drop=name)
    with pytest.raises(ImporterError, match="missing keys.*cross_attention/mha/key_dense/vars/1"):
        from_tf_tutorial(read_keras_file(bad).weights, bos_id=BOS, eos_id=EOS)


def test_a_wrong_shape_and_a_contradicting_flag_are_named(tmp_dir):
    _, path, _, _ = source("1-layer-d16", tmp_dir)
    bad = rewrite(path, f"{tmp_dir}/shape.weights.h5", replace=("final_layer/vars/1", np.zeros(12)))
    with pytest.raises(ImporterError, match=r"final_layer/vars/1: expected shape \(13,\), got \(12,\)"):
        from_tf_tutorial(read_keras_file(bad).weights, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ImporterError, match="bos_id"):
        from_tf_tutorial(read_keras_file(path).weights, bos_id=13, eos_id=EOS)


def test_another_architecture_is_refused_with_a_hint(tmp_dir):
    _, path, _, _ = source("1-layer-d16", tmp_dir)
    with pytest.raises(ImporterError, match="look like the TensorFlow tutorial's variables"):
        from_keras_hub(read_keras_file(path).weights, bos_id=BOS, eos_id=EOS, mask_zero=True)
    with pytest.raises(ImporterError, match="not a readable HDF5"):
        read_keras_file(__file__)


# -- the command line -----------------------------------------------------------------------------
def test_convert_to_a_torch_checkpoint_end_to_end(tmp_dir, tmp_path, capsys):
    import torch_impl

    model, path, config, _ = source("2-layers-d8-float32", tmp_dir)
    out = tmp_path / "tutorial.pt"
    assert main(["convert", path, str(out), "--from", "tf-tutorial", "--bos-id", "2", "--eos-id", "3",
                 "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed
    assert "note: under Keras 3 the tutorial's masks reach only the first self-attention" in printed  # issue 26
    loaded = torch_impl.load_checkpoint(out)
    assert loaded.config == config
    src, tgt = unpadded(config)
    assert_close(TORCH.logits(loaded, src, tgt), keras_logits(model, src, tgt),
                 bound_for("float32", "keras-source:torch"), "converted torch logits")


def test_convert_refuses_bad_input_and_writes_nothing(tmp_dir, tmp_path, capsys):
    _, path, _, _ = source("1-layer-d16", tmp_dir)
    bad = rewrite(path, str(tmp_path / "bad.weights.h5"), drop="final_layer/vars/0")
    out = tmp_path / "out.pt"
    assert main(["convert", bad, str(out), "--from", "tf-tutorial", "--bos-id", "2", "--eos-id", "3"]) == 2
    err = capsys.readouterr().err
    assert "bad.weights.h5" in err and "final_layer/vars/0" in err
    assert not out.exists()
    assert main(["convert", path, str(out), "--from", "tf-tutorial", "--eos-id", "3"]) == 2
    assert "--bos-id required" in capsys.readouterr().err
    assert main(["convert", path, str(out), "--from", "tf-tutorial", "--bos-id", "2", "--eos-id", "3",
                 "--n-heads", "2"]) == 2
    assert "--n-heads: only for --from nn-transformer / annotated, not --from tf-tutorial" in capsys.readouterr().err
    assert not out.exists()
