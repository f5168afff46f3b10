"""tf_impl canonical weights: bit-exact round trip, all-or-nothing import, tied variables."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from parity_tests.matrix import VARIANTS  # noqa: E402
from parity_tests.tf_support import run_logits  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import WeightsError, parameter_count, random_weights, weight_schema  # noqa: E402
from tf_impl import weights_io  # noqa: E402

TINY_VARIANTS = sorted(v for v in VARIANTS if v != "base")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_export_after_import_is_bit_exact(variant, dtype):
    config = VARIANTS[variant].replace(dtype=dtype, final_norm=VARIANTS[variant].final_norm)
    w = random_weights(config, 3)
    w["generator.bias"][0] = -0.0  # the sign of zero survives too
    model = tf_impl.Transformer(config)
    model.import_weights(w)
    out = model.export_weights()
    assert list(out) == list(weight_schema(config))
    for name, value in w.items():
        assert out[name].dtype == value.dtype and out[name].flags.c_contiguous, name
        assert out[name].tobytes() == value.tobytes(), name  # bit for bit, -0.0 and all
    out["src_embed.embeddings"][0, 0] += 1  # exported arrays own their memory
    assert model.export_weights()["src_embed.embeddings"][0, 0] == w["src_embed.embeddings"][0, 0]


def test_weights_exist_and_export_before_any_call():
    config = TransformerConfig.preset("tiny")
    model = tf_impl.Transformer(config)
    out = model.export_weights()
    assert {k: v.shape for k, v in out.items()} == weight_schema(config)
    # The training initialisation: Xavier-uniform matrices, zero biases, unit gains.
    assert (out["encoder.layers.0.self_attn_norm.gamma"] == 1).all()
    assert (out["decoder.layers.1.ffn.inner.bias"] == 0).all()
    limit = np.sqrt(6 / (16 + 32))
    kernel = out["encoder.layers.0.ffn.inner.kernel"]
    assert np.abs(kernel).max() <= limit and kernel.std() > limit / 4


def test_bad_import_reports_everything_and_changes_nothing():
    config = TransformerConfig.preset("tiny")
    model = tf_impl.Transformer(config)
    before = model.export_weights()
    bad = dict(random_weights(config, 1))
    del bad["generator.bias"]
    bad["extra.weight"] = np.zeros(3, np.float32)
    bad["encoder.layers.0.self_attn.query.kernel"] = np.zeros((16, 8), np.float32)
    bad["decoder.layers.1.ffn_norm.gamma"] = bad["decoder.layers.1.ffn_norm.gamma"].astype(np.float64)
    bad["src_embed.embeddings"] = bad["src_embed.embeddings"].copy()
    bad["src_embed.embeddings"][0, 0] = np.nan
    with pytest.raises(WeightsError) as err:
        model.import_weights(bad)
    assert len(err.value.problems) == 5, err.value.problems
    message = str(err.value)
    assert message.startswith("import_weights: 5 problem(s)")
    for needle in ("missing: ['generator.bias']", "unexpected: ['extra.weight']",
                   "query.kernel: expected shape (16, 16), got (16, 8)",
                   "ffn_norm.gamma: expected dtype float32, got float64",
                   "src_embed.embeddings: contains NaN or Inf"):
        assert needle in message
    after = model.export_weights()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_import_refuses_a_transposed_kernel_and_a_non_array():
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 1)
    w["encoder.layers.0.ffn.inner.kernel"] = w["encoder.layers.0.ffn.inner.kernel"].T.copy()
    with pytest.raises(WeightsError, match=r"ffn.inner.kernel: expected shape \(16, 32\), got \(32, 16\)"):
        tf_impl.Transformer(config).import_weights(w)
    w = random_weights(config, 1)
    w["generator.bias"] = tf.constant(w["generator.bias"])
    with pytest.raises(WeightsError, match="generator.bias: expected a numpy array, got"):
        tf_impl.Transformer(config).import_weights(w)


@pytest.mark.parametrize("share, tie", [(False, False), (True, False), (False, True), (True, True)])
def test_tied_variables_are_one_variable(share, tie):
    tiny = TransformerConfig.preset("tiny", dtype="float64")
    config = tiny.replace(tgt_vocab=tiny.src_vocab, share_embeddings=share, tie_output=tie)
    model = tf_impl.Transformer(config)
    assert (model.tgt_embed is model.src_embed) == share
    assert sum(int(np.prod(v.shape)) for v in model.trainable_weights) == parameter_count(config)
    assert len(model.trainable_weights) == len(weight_schema(config))
    assert all(v.dtype == "float64" for v in model.weights)
    assert (model.generator.kernel is None) == tie
    # The tie is live: changing the embedding table changes the logits through the generator.
    src, tgt = src_tgt(config)
    before = run_logits(model, src, tgt)
    table = model.tgt_embed.embeddings
    table.assign(tf.concat([table[:5], table[5:] * 2.0], axis=0))
    assert not np.allclose(run_logits(model, src, tgt)[..., 5:], before[..., 5:])


def test_variable_table_names_every_trainable_variable_once():
    config = TransformerConfig.preset("tiny").replace(tie_output=True)
    model = tf_impl.Transformer(config)
    table = weights_io.variable_table(model)
    assert sorted(id(v) for v in table.values()) == sorted(id(v) for v in model.trainable_weights)


def test_positional_table_is_a_constant_not_a_weight():
    config = TransformerConfig.preset("tiny")
    model = tf_impl.Transformer(config)
    assert not any("positional" in v.path for v in model.weights)
    assert model.positional.table.dtype == tf.float32
    assert model.positional.table.shape == (config.max_len, config.d_model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_keras_save_and_load_model_round_trip(tmp_path, dtype):
    """``model.save`` / ``keras.models.load_model`` keep every weight (Keras' saving skips attributes
    that a plain Layer also has, such as ``output``: the attention's output projection must still be
    saved)."""
    import keras

    config = TransformerConfig.preset("tiny", dtype=dtype).replace(tie_output=True)
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, 4))
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded, tf_impl.Transformer) and loaded.config == config
    before, after = model.export_weights(), loaded.export_weights()
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    src, tgt = src_tgt(config)
    np.testing.assert_array_equal(run_logits(loaded, src, tgt), run_logits(model, src, tgt))
