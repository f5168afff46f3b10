"""torch_impl canonical weights: bit-exact round trip, all-or-nothing import, tied parameters."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_impl  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from parity_tests.matrix import VARIANTS  # noqa: E402
from parity_tests.torch_support import build, run_logits  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import WeightsError, parameter_count, random_weights, weight_schema  # noqa: E402

TINY_VARIANTS = sorted(v for v in VARIANTS if v != "base")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_export_after_import_is_bit_exact(variant, dtype):
    config = VARIANTS[variant].replace(dtype=dtype, final_norm=VARIANTS[variant].final_norm)
    w = random_weights(config, 3)
    model = torch_impl.Transformer(config)
    model.import_weights(w)
    out = model.export_weights()
    assert list(out) == list(weight_schema(config))
    for name, value in w.items():
        assert out[name].dtype == value.dtype and out[name].flags.c_contiguous, name
        assert out[name].tobytes() == value.tobytes(), name  # bit for bit, -0.0 and all
    out["src_embed.embeddings"][0, 0] += 1  # exported arrays own their memory
    assert model.export_weights()["src_embed.embeddings"][0, 0] == w["src_embed.embeddings"][0, 0]


def test_bad_import_reports_everything_and_changes_nothing():
    config = TransformerConfig.preset("tiny")
    model = torch_impl.Transformer(config)
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


def test_import_refuses_a_transposed_kernel():
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 1)
    w["encoder.layers.0.ffn.inner.kernel"] = w["encoder.layers.0.ffn.inner.kernel"].T.copy()
    with pytest.raises(WeightsError, match=r"ffn.inner.kernel: expected shape \(16, 32\), got \(32, 16\)"):
        torch_impl.Transformer(config).import_weights(w)


@pytest.mark.parametrize("share, tie", [(False, False), (True, False), (False, True), (True, True)])
def test_tied_parameters_are_one_tensor(share, tie):
    tiny = TransformerConfig.preset("tiny", dtype="float64")
    config = tiny.replace(tgt_vocab=tiny.src_vocab, share_embeddings=share, tie_output=tie)
    model = torch_impl.Transformer(config)
    assert (model.tgt_embed is model.src_embed) == share
    assert sum(p.numel() for p in model.parameters()) == parameter_count(config)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert (model.generator.kernel is None) == tie
    # The tie is live: changing the embedding table changes the logits through the generator.
    src, tgt = src_tgt(config)
    model.eval()
    before = run_logits(model, src, tgt)
    with torch.no_grad():
        model.tgt_embed.table.weight[5:].mul_(2.0)
    assert not np.allclose(run_logits(model, src, tgt)[..., 5:], before[..., 5:])


def test_positional_table_is_a_buffer_not_a_weight():
    config = TransformerConfig.preset("tiny")
    model = torch_impl.Transformer(config)
    assert "positional.table" not in model.state_dict()
    assert model.positional.table.dtype == torch.float32
    assert model.positional.table.shape == (config.max_len, config.d_model)


def test_fresh_model_has_the_training_initialisation():
    config = TransformerConfig.preset("tiny")
    w = torch_impl.Transformer(config).export_weights()
    k = w["encoder.layers.0.ffn.inner.kernel"]
    assert np.abs(k).max() <= np.sqrt(6 / (16 + 32)) and k.std() > 0
    assert (w["encoder.layers.0.ffn_norm.gamma"] == 1).all() and (w["generator.bias"] == 0).all()
    assert (w["encoder.layers.0.self_attn.query.bias"] == 0).all()


def test_import_then_move_to_float64_and_back_keeps_weights():
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 2)
    model = build(config, w)
    model.double().float()
    assert all(model.export_weights()[k].tobytes() == v.tobytes() for k, v in w.items())
