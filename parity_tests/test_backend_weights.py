"""Canonical weights in both backends, one contract each, parametrized by backend: the bit-exact
import/export round trip (-0.0 included), all-or-nothing import, refusals (a transposed kernel, a
framework tensor instead of a NumPy array), tied weights as one tensor, the training initialisation.

What one framework alone has is in test_torch_weights.py and test_tf_weights.py; the checkpoint
files are in test_checkpoints.py.
"""
import numpy as np
import pytest

from parity_tests.checkpoint_backends import BACKENDS, side
from parity_tests.matrix import VARIANTS
from shared import TransformerConfig
from shared.batches import src_tgt
from shared.weights import WeightsError, parameter_count, random_weights, weight_schema

TINY_VARIANTS = sorted(v for v in VARIANTS if v != "base")


@pytest.fixture(params=BACKENDS, scope="module")
def backend(request):
    pytest.importorskip("torch" if request.param == "torch" else "tensorflow")
    return side(request.param)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_export_after_import_is_bit_exact(backend, variant, dtype):
    config = VARIANTS[variant].replace(dtype=dtype, final_norm=VARIANTS[variant].final_norm)
    w = random_weights(config, 3)
    w["generator.bias"][0] = -0.0  # the sign of zero survives too
    model = backend.model(config, w)
    out = model.export_weights()
    assert list(out) == list(weight_schema(config))
    for name, value in w.items():
        assert out[name].dtype == value.dtype and out[name].flags.c_contiguous, name
        assert out[name].tobytes() == value.tobytes(), name  # bit for bit, -0.0 and all
    assert np.signbit(out["generator.bias"][0])
    out["src_embed.embeddings"][0, 0] += 1  # exported arrays own their memory
    assert model.export_weights()["src_embed.embeddings"][0, 0] == w["src_embed.embeddings"][0, 0]


def test_big_endian_weights_import_as_their_values(backend):
    """Weights a big-endian file gave (``>f4``) import bit for bit, and export native."""
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 2)
    out = backend.model(config, {k: v.astype(v.dtype.newbyteorder(">")) for k, v in w.items()}).export_weights()
    for name, value in w.items():
        assert out[name].dtype == value.dtype and out[name].tobytes() == value.tobytes(), name


def test_fresh_model_has_the_training_initialisation(backend):
    """Weights exist and export before any call: Xavier-uniform matrices, zero biases, unit gains."""
    config = TransformerConfig.preset("tiny")
    out = backend.model(config).export_weights()
    assert {k: v.shape for k, v in out.items()} == weight_schema(config)
    limit = np.sqrt(6 / (16 + 32))
    kernel = out["encoder.layers.0.ffn.inner.kernel"]
    assert np.abs(kernel).max() <= limit and kernel.std() > limit / 4
    assert (out["encoder.layers.0.ffn_norm.gamma"] == 1).all() and (out["generator.bias"] == 0).all()
    assert (out["encoder.layers.0.self_attn_norm.gamma"] == 1).all()
    assert (out["encoder.layers.0.self_attn.query.bias"] == 0).all()
    assert (out["decoder.layers.1.ffn.inner.bias"] == 0).all()


def test_bad_import_reports_everything_and_changes_nothing(backend):
    config = TransformerConfig.preset("tiny")
    model = backend.model(config)
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


def test_import_refuses_a_transposed_kernel_and_a_non_array(backend):
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 1)
    w["encoder.layers.0.ffn.inner.kernel"] = w["encoder.layers.0.ffn.inner.kernel"].T.copy()
    with pytest.raises(WeightsError, match=r"ffn.inner.kernel: expected shape \(16, 32\), got \(32, 16\)"):
        backend.model(config).import_weights(w)
    w = random_weights(config, 1)
    w["generator.bias"] = backend.tensor(w["generator.bias"])  # the framework's tensor, not NumPy
    with pytest.raises(WeightsError, match="generator.bias: expected a numpy array, got"):
        backend.model(config).import_weights(w)


@pytest.mark.parametrize("share, tie", [(False, False), (True, False), (False, True), (True, True)])
def test_tied_weights_are_one_tensor(backend, share, tie):
    tiny = TransformerConfig.preset("tiny", dtype="float64")
    config = tiny.replace(tgt_vocab=tiny.src_vocab, share_embeddings=share, tie_output=tie)
    model = backend.model(config)
    assert (model.tgt_embed is model.src_embed) == share
    trainable = backend.trainable(model)
    assert sum(int(np.prod(tuple(p.shape))) for p in trainable) == parameter_count(config)
    assert len(trainable) == len(weight_schema(config))
    assert backend.dtypes(model) == {"float64"}
    assert (model.generator.kernel is None) == tie
    # The tie is live: changing the embedding table changes the logits through the generator.
    src, tgt = src_tgt(config)
    before = backend.logits(model, src, tgt)
    backend.scale_tgt_rows(model, 5, 2.0)
    assert not np.allclose(backend.logits(model, src, tgt)[..., 5:], before[..., 5:])


@pytest.mark.parametrize("tie", [False, True])
def test_weight_table_names_every_trainable_tensor_once(backend, tie):
    model = backend.model(TransformerConfig.preset("tiny").replace(tie_output=tie))
    assert sorted(backend.table_ids(model)) == sorted(id(p) for p in backend.trainable(model))


def test_positional_table_is_not_a_weight(backend):
    config = TransformerConfig.preset("tiny")
    saved, dtype, shape = backend.positional(backend.model(config))
    assert not saved
    assert dtype == "float32" and shape == (config.max_len, config.d_model)
