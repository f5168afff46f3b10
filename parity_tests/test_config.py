import dataclasses
import json

import pytest

from shared import PRESETS, TransformerConfig


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate_and_round_trip_through_json(name):
    config = TransformerConfig.preset(name)
    assert TransformerConfig.from_json(config.to_json()) == config
    assert TransformerConfig.from_dict(json.loads(config.to_json())) == config


def test_paper_sizes():
    base, big = TransformerConfig.preset("base"), TransformerConfig.preset("big")
    assert (base.d_model, base.n_heads, base.d_ff, base.n_encoder_layers, base.dropout) == (512, 8, 2048, 6, 0.1)
    assert (big.d_model, big.n_heads, big.d_ff, big.n_decoder_layers, big.dropout) == (1024, 16, 4096, 6, 0.3)
    assert base.d_k == 64 and not base.norm_first and base.final_norm is False


def test_final_norm_follows_placement_unless_given():
    tiny = TransformerConfig.preset("tiny")
    assert tiny.norm_first and tiny.final_norm
    post = tiny.replace(norm_first=False)
    assert post.final_norm is False
    assert tiny.replace(norm_first=False, final_norm=True).final_norm is True


def test_frozen():
    config = TransformerConfig.preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32


@pytest.mark.parametrize("changes, field, needle", [
    (dict(d_model=30, n_heads=4), "d_model", "multiple of n_heads=4, got 30"),
    (dict(d_model=0), "d_model", "positive"),
    (dict(n_heads=-1), "n_heads", "positive"),
    (dict(d_ff=0), "d_ff", "positive"),
    (dict(n_encoder_layers=0), "n_encoder_layers", "positive"),
    (dict(max_len=0), "max_len", "positive"),
    (dict(src_vocab=2.5), "src_vocab", "expected an int, got 2.5"),
    (dict(d_model=True), "d_model", "expected an int, got True"),
    (dict(dropout=1.0), "dropout", "[0, 1), got 1.0"),
    (dict(dropout=-0.1), "dropout", "[0, 1)"),
    (dict(norm_eps=0.0), "norm_eps", "positive"),
    (dict(norm_eps=1e308), "norm_eps", "a value float32 holds, neither 0 nor inf there"),  # inf in float32
    (dict(norm_eps=1e-50), "norm_eps", "got 1e-50"),  # 0 in float32
    (dict(norm_style="rms"), "norm_style", "'rms'"),
    (dict(dtype="float16"), "dtype", "'float16'"),
    (dict(norm_first="yes"), "norm_first", "bool"),
    (dict(share_embeddings=True), "share_embeddings", "src_vocab=13, tgt_vocab=17"),
    (dict(pad_id=13), "pad_id", "0 <= pad_id < 13"),
    (dict(bos_id=17), "bos_id", "< tgt_vocab=17, got 17"),
    (dict(eos_id=-1), "eos_id", "got -1"),
    (dict(bos_id=0), "bos_id", "different from pad_id=0"),
    (dict(n_heads=2, d_model=1), "d_model", "multiple of n_heads"),
    (dict(n_heads=1, d_model=1, norm_style="annotated"), "d_model", "d_model - 1"),
])
def test_invalid_configs_name_field_expectation_and_value(changes, field, needle):
    with pytest.raises(ValueError) as err:
        TransformerConfig.preset("tiny", **changes)
    message = str(err.value)
    assert f"TransformerConfig.{field}" in message and needle in message


def test_json_errors():
    with pytest.raises(ValueError, match="not valid JSON"):
        TransformerConfig.from_json("{")
    with pytest.raises(ValueError, match=r"unknown fields \['colour'\]"):
        TransformerConfig.from_dict({**TransformerConfig.preset("tiny").to_dict(), "colour": 1})
    with pytest.raises(ValueError, match=r"missing required fields \['tgt_vocab'\]"):
        TransformerConfig.from_dict({"src_vocab": 3})
    with pytest.raises(ValueError, match="preset: name expected one of"):
        TransformerConfig.preset("huge")
