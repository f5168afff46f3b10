"""KerasHub seq2seq models as the keras.io example builds them (``TokenAndPositionEmbedding``,
``TransformerEncoder``, ``TransformerDecoder``, ``Dense(vocab, softmax)``), with keras_hub as
installed, random weights in every variable, saved (``.weights.h5`` and ``.keras``), imported
(`shared.importers.from_keras_hub`, ``twins convert --from keras-hub``) and run in the reference,
torch_impl and tf_impl against the source model's log-probabilities and its greedy loop.

Log-probabilities are compared at the real target positions: at a padded target position the
source's output depends on nothing a real position reads (its padded keys are masked), so no user
sees it; the canonical model computes something else there (it never masks queries). Without
``mask_zero`` nothing is masked and every position is compared.
"""
import functools
import json
import zipfile

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")

from parity_tests import keras_source_models as K  # noqa: E402
from parity_tests.backends import Backend  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.importers import ImporterError, from_keras_hub, read_keras_file  # noqa: E402
from shared.loss import log_softmax  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for, max_rel_diff  # noqa: E402
from tf_impl import decoding as tf_decoding  # noqa: E402
from torch_impl import decoding as torch_decoding  # noqa: E402
from twins.cli import main  # noqa: E402

# Keras warns that layers without mask support (PositionEmbedding, EinsumDense) "destroy the mask
# information"; KerasHub sets the mask again itself (what the tests check).
# A one-head model's first decoding step softmaxes over one key, which Keras also warns about.
pytestmark = [pytest.mark.filterwarnings("ignore:Layer '.*' .* does not support masking:UserWarning"),
              pytest.mark.filterwarnings("ignore:You are using a softmax over axis:UserWarning")]
BOS, EOS = 2, 3
TORCH, TF = Backend("torch", "eager", "cpu"), Backend("tf", "eager", "/CPU:0")
# key_dim = d / heads is 4 or 16 in float64 (an exact 1/sqrt(key_dim) in Keras, see
# test_interop_tf_tutorial.py); dropout 0 and 0.1 take Keras' two attention paths. GELU only in
# float32: Keras' gelu is tf.nn.gelu, 5e-9 from the erf formula in float64 (tf_impl/feed_forward.py).
SETTINGS = {
    "masked-post-norm": dict(args=dict(src_vocab=11, tgt_vocab=13, max_len=12, d=16, heads=4, ff=24,
                                       n_enc=2, n_dec=1, mask_zero=True, dropout=0.0),
                             flags=dict(mask_zero=True), dtype="float64"),
    "unmasked-pre-norm-swish": dict(args=dict(src_vocab=10, tgt_vocab=10, max_len=9, d=16, heads=1,
                                             ff=20, n_enc=1, n_dec=2, mask_zero=False, dropout=0.1,
                                             normalize_first=True, activation="swish",
                                             layer_norm_epsilon=1e-4),
                                   flags=dict(mask_zero=False, normalize_first=True, activation="swish",
                                              norm_eps=1e-4), dtype="float64"),
    "flat-masked-gelu-float32": dict(args=dict(src_vocab=9, tgt_vocab=12, max_len=10, d=8, heads=2,
                                                ff=12, mask_zero=True, nested=False, dropout=0.1,
                                                activation="gelu"),
                                      flags=dict(mask_zero=True, activation="gelu"), dtype="float32"),
}


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("keras_hub"))


@functools.lru_cache(maxsize=None)
def source(name: str, tmp_dir: str):
    """(Keras model, .weights.h5 path, config, canonical weights)."""
    setting = SETTINGS[name]
    with K.float_policy(setting["dtype"]):
        model = K.keras_hub_model(**setting["args"])
    K.randomize(model, seed=sorted(SETTINGS).index(name))
    path = f"{tmp_dir}/{name}.weights.h5"
    model.save_weights(path)
    config, weights = from_keras_hub(read_keras_file(path).weights, bos_id=BOS, eos_id=EOS,
                                     **setting["flags"])
    return model, path, config, weights


def batch(config, seed=0):
    """Rows: full, padded source and target, source of one token."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, config.src_vocab, (3, 7))
    tgt = rng.integers(1, config.tgt_vocab, (3, 6))
    tgt[:, 0] = BOS
    src[1, 4:], tgt[1, 3:], src[2, 1:] = 0, 0, 0
    return src, tgt


def source_log_probs(model, src, tgt) -> np.ndarray:
    return np.log(np.asarray(model([src, tgt], training=False)).astype(np.float64))


def compared(config, tgt) -> np.ndarray:
    """The positions compared: real target tokens (every one without mask_zero)."""
    return tgt != config.pad_id if config.mask_padding else np.ones(tgt.shape, bool)


def bound(config, pair):
    return FLOAT64 if config.dtype == "float64" else bound_for("float32", pair)


def test_the_config_says_what_the_layers_compute(tmp_dir):
    _, _, config, weights = source("unmasked-pre-norm-swish", tmp_dir)
    assert (config.positional, config.embed_scale, config.final_norm, config.norm_first) == ("learned", False, False, True)
    assert (config.activation, config.norm_eps, config.mask_padding, config.max_len) == ("swish", 1e-4, False, 9)
    assert (config.n_heads, config.head_dim, config.n_encoder_layers, config.n_decoder_layers) == (1, None, 1, 2)
    assert weights["tgt_embed.positions"].shape == (9, 16)
    _, _, masked, _ = source("masked-post-norm", tmp_dir)
    assert masked.mask_padding and masked.pad_id == 0 and masked.norm_eps == 1e-5 and not masked.norm_first


@pytest.mark.parametrize("name", list(SETTINGS))
def test_log_probs_equal_the_source_model_in_all_three(name, tmp_dir):
    model, _, config, weights = source(name, tmp_dir)
    src, tgt = batch(config)
    expected = source_log_probs(model, src, tgt)
    where = compared(config, tgt)
    runs = {"reference": R.forward(weights, config, src, tgt)}
    runs["torch"] = TORCH.logits(TORCH.build(config, weights), src, tgt)
    runs["tf"] = TF.logits(TF.build(config, weights), src, tgt)
    for impl, logits in runs.items():
        actual = log_softmax(logits.astype(np.float64))
        assert_close(actual[where], expected[where], bound(config, f"keras-source:{impl}"), f"{impl} log-probs")


def test_a_swapped_tensor_or_a_wrong_mask_setting_breaks_parity(tmp_dir):
    model, path, config, weights = source("masked-post-norm", tmp_dir)
    src, tgt = batch(config)
    expected = source_log_probs(model, src, tgt)
    where = compared(config, tgt)
    swapped = {**weights, "src_embed.positions": weights["tgt_embed.positions"][:12],
               "tgt_embed.positions": weights["src_embed.positions"]}
    assert max_rel_diff(log_softmax(R.forward(swapped, config, src, tgt))[where], expected[where]) > 1e-6
    wrong = config.replace(mask_padding=False)  # mask_zero=False given for a masked model
    assert max_rel_diff(log_softmax(R.forward(weights, wrong, src, tgt))[where], expected[where]) > 1e-3


def test_an_all_padding_source_differs_only_on_the_fused_path(tmp_dir):
    """The one documented exception: with mask_zero, dropout 0 (Keras' fused attention) and a source
    of padding only, Keras gives uniform cross-attention weights over the padded keys, the canonical
    model zero weights (convention 3). With dropout > 0 (the masked-softmax path) they agree."""
    for name, differs in (("masked-post-norm", True), ("flat-masked-gelu-float32", False)):
        model, _, config, weights = source(name, tmp_dir)
        src, tgt = batch(config)
        src[0] = 0
        expected = source_log_probs(model, src, tgt)[0][tgt[0] != 0]
        actual = log_softmax(R.forward(weights, config, src, tgt).astype(np.float64))[0][tgt[0] != 0]
        if differs:
            assert max_rel_diff(actual, expected) > 1e-3
        else:
            assert_close(actual, expected, bound(config, "keras-source:reference"), "all-padding row")


def test_greedy_tokens_equal_a_greedy_loop_on_the_source(tmp_dir):
    """One setting (each costs seconds: an eager Keras call per step, a compiled TF decoder);
    decoding with mask_padding=False is checked against the oracle in test_variants_parity.py."""
    model, _, config, weights = source("masked-post-norm", tmp_dir)
    src, _ = batch(config, seed=4)
    expected = K.source_greedy(lambda s, p: source_log_probs(model, s, p)[:, -1], src, BOS, EOS,
                               config.pad_id, max_new=6)
    np.testing.assert_array_equal(R.greedy_decode(R.Model(weights, config), src, 6).tokens, expected)
    np.testing.assert_array_equal(
        torch_decoding.greedy_decode(TORCH.build(config, weights), src, 6).tokens, expected)
    np.testing.assert_array_equal(
        tf_decoding.greedy_decode(TF.build(config, weights), src, 6).tokens, expected)


# -- .keras files ---------------------------------------------------------------------------------
def test_a_keras_file_stores_the_settings(tmp_dir):
    model, path, config, weights = source("unmasked-pre-norm-swish", tmp_dir)
    archive = f"{tmp_dir}/model.keras"
    model.save(archive)
    file = read_keras_file(archive)
    got_config, got = from_keras_hub(file.weights, bos_id=BOS, eos_id=EOS, keras_config=file.config)
    assert got_config == config and all(np.array_equal(got[k], weights[k]) for k in weights)
    with pytest.raises(ImporterError, match="normalize_first: the .keras config says True, the argument False"):
        from_keras_hub(file.weights, bos_id=BOS, eos_id=EOS, keras_config=file.config, normalize_first=False)


def test_a_keras_file_whose_loading_runs_code_is_refused(tmp_dir):
    """A Lambda layer's config carries Python bytecode: refused by name, never loaded."""
    inputs = keras.Input(shape=(3,))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2.0, name="doubler")(inputs))
    archive = f"{tmp_dir}/lambda.keras"
    model.save(archive)
    with pytest.raises(ImporterError, match="Lambda 'doubler': loading it would execute Python code"):
        read_keras_file(archive)
    custom = f"{tmp_dir}/custom.keras"  # the same archive with a layer of a user's module
    with zipfile.ZipFile(archive) as a, zipfile.ZipFile(custom, "w") as b:
        for item in a.namelist():
            data = a.read(item)
            if item == "config.json":
                config = json.loads(data)
                config["config"]["layers"][1].update(class_name="MyLayer", module="my_project.layers")
                data = json.dumps(config).encode()
            b.writestr(item, data)
    with pytest.raises(ImporterError, match="MyLayer 'doubler' from module 'my_project.layers'"):
        read_keras_file(custom)


# -- bad input ------------------------------------------------------------------------------------
def test_settings_a_weights_file_cannot_tell_are_required_or_checked(tmp_dir):
    _, path, _, _ = source("masked-post-norm", tmp_dir)
    variables = read_keras_file(path).weights
    with pytest.raises(ImporterError, match="mask_zero: required"):
        from_keras_hub(variables, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ImporterError, match="pad_id: expected 0 with mask_zero=True"):
        from_keras_hub(variables, bos_id=BOS, eos_id=EOS, pad_id=1, mask_zero=True)
    missing = {k: v for k, v in variables.items() if not k.endswith("_cross_attention_layer/value_dense/vars/0")}
    with pytest.raises(ImporterError, match="missing keys.*_cross_attention_layer/value_dense/vars/0"):
        from_keras_hub(missing, bos_id=BOS, eos_id=EOS, mask_zero=True)
    key = "layers/transformer_encoder_1/_feedforward_output_dense/vars/1"
    with pytest.raises(ImporterError, match=rf"{key}: expected shape \(16,\), got \(15,\)"):
        from_keras_hub({**variables, key: np.zeros(15)}, bos_id=BOS, eos_id=EOS, mask_zero=True)


def test_a_flat_model_with_equal_vocabularies_is_refused(tmp_dir):
    model = K.keras_hub_model(7, 7, 5, 4, 1, 6, nested=False)
    path = f"{tmp_dir}/flat.weights.h5"
    model.save_weights(path)
    with pytest.raises(ImporterError, match="cannot tell the source embedding from the target one") as info:
        from_keras_hub(read_keras_file(path).weights, bos_id=BOS, eos_id=EOS, mask_zero=False)
    assert len(info.value.problems) == 1, info.value  # not also 'cannot infer src_vocab: None/...'


def test_convert_end_to_end_and_bad_input(tmp_dir, tmp_path, capsys):
    import torch_impl

    model, path, config, _ = source("flat-masked-gelu-float32", tmp_dir)
    out = tmp_path / "hub.pt"
    assert main(["convert", path, str(out), "--from", "keras-hub", "--bos-id", "2", "--eos-id", "3",
                 "--mask-zero", "true", "--activation", "gelu", "--verify"]) == 0
    assert "PASS" in capsys.readouterr().out
    src, tgt = batch(config)
    actual = log_softmax(TORCH.logits(torch_impl.load_checkpoint(out), src, tgt).astype(np.float64))
    where = compared(config, tgt)
    assert_close(actual[where], source_log_probs(model, src, tgt)[where],
                 bound_for("float32", "keras-source:torch"), "converted torch log-probs")
    bad = tmp_path / "bad.pt"
    assert main(["convert", path, str(bad), "--from", "keras-hub", "--bos-id", "2", "--eos-id", "3"]) == 2
    assert "mask_zero: required" in capsys.readouterr().err and not bad.exists()
    assert main(["convert", path, str(bad), "--from", "keras-hub", "--bos-id", "2", "--eos-id", "3",
                 "--mask-zero", "true", "--norm-first", "true"]) == 2
    assert "--normalize-first" in capsys.readouterr().err and not bad.exists()
