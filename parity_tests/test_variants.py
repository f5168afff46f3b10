"""The architecture variants of `TransformerConfig` (docs/design.md, convention 15), framework-free:
validation, JSON compatibility, the positional tables against their closed forms, the weight
schema, the target-mask rule for a pad start token, the reference's formulas and the search's ids.
The backends' parity on the same variants is test_variants_parity.py."""
import dataclasses
import json
import math

import numpy as np
import pytest

from shared import TransformerConfig, make_tgt_mask, positional_encoding, positional_table, start_is_pad
from shared import decoding as D
from shared import reference as R
from shared import tasks
from shared.batches import src_tgt
from shared.positional import inverse_frequencies
from shared.weights import (init_weights, load_checkpoint, random_weights, save_checkpoint,
                            tgt_positions_name, weight_schema)

BASE = dict(src_vocab=11, tgt_vocab=13, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=1,
            n_decoder_layers=1, max_len=9, dropout=0.0, dtype="float64")
NEW_FIELDS = {"activation": "relu", "positional": "sinusoidal", "pe_layout": "interleaved",
              "pe_timescale": "paper", "pe_offset": 0, "embed_scale": True, "head_dim": None,
              "decoder_start_id": None, "mask_padding": True}


# -- the config -----------------------------------------------------------------------------------
def test_defaults_are_the_paper_model():
    config = TransformerConfig(**BASE)
    assert {name: getattr(config, name) for name in NEW_FIELDS} == NEW_FIELDS
    assert config.d_k == 4 and config.start_id == config.bos_id and not start_is_pad(config)


def test_a_config_json_without_the_new_fields_loads_with_the_defaults():
    old = {k: v for k, v in TransformerConfig(**BASE).to_dict().items() if k not in NEW_FIELDS}
    assert TransformerConfig.from_json(json.dumps(old)) == TransformerConfig(**BASE)


def test_the_new_fields_are_stored_and_read_back():
    config = TransformerConfig(**{**BASE, "activation": "swish", "pe_layout": "halves", "pe_offset": 2,
                                  "embed_scale": False, "head_dim": 3, "decoder_start_id": 0,
                                  "mask_padding": False})
    data = json.loads(config.to_json())
    assert {k: data[k] for k in NEW_FIELDS} == {k: getattr(config, k) for k in NEW_FIELDS}
    assert TransformerConfig.from_json(config.to_json()) == config


def test_an_unknown_field_is_refused_naming_it():
    data = {**TransformerConfig(**BASE).to_dict(), "rotary": True}
    with pytest.raises(ValueError, match=r"unknown fields \['rotary'\].*newer version"):
        TransformerConfig.from_dict(data)


def test_a_checkpoint_written_before_the_variants_loads_and_computes_as_before(tmp_path):
    """A neutral checkpoint whose config.json lacks the new fields (as every file written before
    them does) loads as the default model and gives the same logits as that model."""
    config = TransformerConfig(**BASE)
    weights = random_weights(config, 3)
    save_checkpoint(tmp_path / "old", config, weights)
    file = tmp_path / "old" / "config.json"
    header = json.loads(file.read_text())
    header["config"] = {k: v for k, v in header["config"].items() if k not in NEW_FIELDS}
    file.write_text(json.dumps(header))
    loaded, loaded_weights = load_checkpoint(tmp_path / "old")
    assert loaded == config
    src, tgt = src_tgt(config, 2, 5, 4)
    np.testing.assert_array_equal(R.forward(loaded_weights, loaded, src, tgt),
                                  R.forward(weights, config, src, tgt))


def test_a_checkpoint_with_a_field_from_a_newer_version_is_refused(tmp_path):
    config = TransformerConfig(**BASE)
    save_checkpoint(tmp_path / "new", config, random_weights(config))
    file = tmp_path / "new" / "config.json"
    header = json.loads(file.read_text())
    header["config"]["rope_theta"] = 10000.0
    file.write_text(json.dumps(header))
    with pytest.raises(ValueError, match=r"invalid config: .*unknown fields \['rope_theta'\]"):
        load_checkpoint(tmp_path / "new")


BAD = [
    (dict(activation="tanh"), "activation", r"expected one of \('relu', 'gelu', 'swish'\), got 'tanh'"),
    (dict(activation=None), "activation", "got None"),
    (dict(positional="rotary"), "positional", r"expected one of \('sinusoidal', 'learned'\)"),
    (dict(pe_layout="sin-cos"), "pe_layout", r"expected one of \('interleaved', 'halves'\)"),
    (dict(pe_timescale="fairseq"), "pe_timescale", r"expected one of \('paper', 't2t'\)"),
    (dict(pe_offset=-1), "pe_offset", "expected an int >= 0, got -1"),
    (dict(pe_offset=1.0), "pe_offset", "expected an int, got 1.0"),
    (dict(pe_offset=True), "pe_offset", "expected an int, got True"),
    (dict(embed_scale=1), "embed_scale", "expected a bool, got 1"),
    (dict(head_dim=0), "head_dim", "expected a positive int or None, got 0"),
    (dict(head_dim=2.0), "head_dim", "expected an int or None, got 2.0"),
    (dict(decoder_start_id=13), "decoder_start_id", "< tgt_vocab=13, got 13"),
    (dict(decoder_start_id=-1), "decoder_start_id", "got -1"),
    (dict(decoder_start_id="0"), "decoder_start_id", "expected an int or None, got '0'"),
    (dict(positional="learned", pe_layout="halves"), "pe_layout", "with positional='learned'"),
    (dict(positional="learned", pe_timescale="t2t"), "pe_timescale", "with positional='learned'"),
    (dict(positional="learned", pe_offset=2), "pe_offset", "with positional='learned'"),
    (dict(pe_layout="halves", d_model=9, n_heads=3), "d_model", "even d_model with pe_layout='halves'"),
    (dict(pe_timescale="t2t", d_model=9, n_heads=3), "d_model", "even d_model >= 4 with pe_timescale"),
    (dict(pe_timescale="t2t", d_model=2, n_heads=1), "d_model", "got 2"),
    (dict(d_model=9, n_heads=2), "d_model", "multiple of n_heads=2"),
]


@pytest.mark.parametrize("changes, field, message", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_values_name_the_field(changes, field, message):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{field}: .*{message}"):
        TransformerConfig(**{**BASE, **changes})


def test_accepted_values():
    # head_dim frees d_model from n_heads; the start id may be pad (Marian) or EOS (FSMT).
    config = TransformerConfig(**{**BASE, "d_model": 9, "n_heads": 2, "head_dim": 5, "decoder_start_id": 0})
    assert config.d_k == 5 and config.start_id == 0 and start_is_pad(config)
    assert TransformerConfig(**{**BASE, "decoder_start_id": 2}).start_id == 2
    # An odd d_model keeps today's interleaved table (its last sine column has no cosine partner).
    assert TransformerConfig(**{**BASE, "d_model": 9, "n_heads": 3, "pe_offset": 4}).pe_offset == 4


# -- positional tables ----------------------------------------------------------------------------
def _frequencies(d: int, timescale: str) -> np.ndarray:
    if timescale == "paper":
        return np.array([10000.0 ** (-2 * i / d) for i in range(d // 2)])
    return np.array([math.exp(-i * math.log(10000.0) / (d / 2 - 1)) for i in range(d // 2)])


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("timescale", ["paper", "t2t"])
@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("d", [4, 10])
def test_every_table_against_its_closed_form(layout, timescale, offset, d):
    table = positional_encoding(12, d, layout, timescale, offset)
    f = _frequencies(d, timescale)
    for p in range(12):
        for i in range(d // 2):
            sin_col, cos_col = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, d // 2 + i)
            assert table[p, sin_col] == pytest.approx(math.sin((p + offset) * f[i]), abs=1e-14)
            assert table[p, cos_col] == pytest.approx(math.cos((p + offset) * f[i]), abs=1e-14)


def test_t2t_frequencies_run_from_1_to_1e_4():
    for d in (4, 16, 512):
        f = inverse_frequencies(d, "t2t")
        assert f.shape == (d // 2,) and f[0] == 1.0 and f[-1] == pytest.approx(1e-4, rel=1e-13)


def test_halves_is_sin_then_cos():
    table, p = positional_encoding(20, 8, "halves"), np.arange(20)
    np.testing.assert_array_equal(table[:, 0], np.sin(p))
    np.testing.assert_array_equal(table[:, 4], np.cos(p))


@pytest.mark.parametrize("layout, timescale", [("interleaved", "paper"), ("halves", "t2t")])
def test_an_offset_shifts_the_rows(layout, timescale):
    shifted = positional_encoding(10, 8, layout, timescale, offset=3)
    np.testing.assert_array_equal(shifted, positional_encoding(13, 8, layout, timescale)[3:])


def test_defaults_are_todays_table_bit_for_bit():
    """The paper's interleaved table as it was computed before the variants existed."""
    d, position = 10, np.arange(20, dtype=np.float64)[:, None]
    angle = position * np.power(10000.0, -np.arange(0, d, 2, dtype=np.float64) / d)
    expected = np.empty((20, d))
    expected[:, 0::2], expected[:, 1::2] = np.sin(angle), np.cos(angle)
    np.testing.assert_array_equal(positional_encoding(20, d), expected)
    np.testing.assert_array_equal(positional_table(TransformerConfig(**{**BASE, "d_model": d, "max_len": 20})),
                                  expected)


def test_positional_table_follows_the_config_and_refuses_learned():
    config = TransformerConfig(**{**BASE, "pe_layout": "halves", "pe_timescale": "t2t", "pe_offset": 2})
    np.testing.assert_array_equal(positional_table(config), positional_encoding(9, 8, "halves", "t2t", 2))
    with pytest.raises(ValueError, match="positional='sinusoidal' .* got positional='learned'"):
        positional_table(config.replace(positional="learned", pe_layout="interleaved",
                                        pe_timescale="paper", pe_offset=0))


@pytest.mark.parametrize("args, message", [
    ((5, 7, "halves"), "even int with layout 'halves'"), ((5, 2, "interleaved", "t2t"), "got 2"),
    ((5, 8, "diagonal"), "layout expected one of"), ((5, 8, "halves", "gnmt"), "timescale expected"),
    ((5, 8, "halves", "paper", -1), "offset expected an int >= 0, got -1"),
])
def test_positional_encoding_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        positional_encoding(*args)


# -- weights --------------------------------------------------------------------------------------
def test_learned_positions_are_weights_one_per_side_or_shared():
    config = TransformerConfig(**{**BASE, "positional": "learned"})
    schema = weight_schema(config)
    assert list(schema)[:4] == ["src_embed.embeddings", "src_embed.positions", "tgt_embed.embeddings",
                                "tgt_embed.positions"]
    assert schema["src_embed.positions"] == schema["tgt_embed.positions"] == (9, 8)
    assert tgt_positions_name(config) == "tgt_embed.positions"
    shared = TransformerConfig(**{**BASE, "tgt_vocab": 11, "positional": "learned", "share_embeddings": True})
    assert "tgt_embed.positions" not in weight_schema(shared)
    assert tgt_positions_name(shared) == "src_embed.positions"
    assert tgt_positions_name(TransformerConfig(**BASE)) is None
    a, b = init_weights(config, 5), init_weights(config, 5)
    assert all(np.array_equal(a[n], b[n]) for n in a)  # deterministic in the seed
    assert not np.array_equal(a["src_embed.positions"], a["tgt_embed.positions"])


def test_head_dim_sets_the_projection_shapes():
    schema = weight_schema(TransformerConfig(**{**BASE, "d_model": 9, "n_heads": 2, "head_dim": 5}))
    for p in ("query", "key", "value"):
        assert schema[f"encoder.layers.0.self_attn.{p}.kernel"] == (9, 10)
        assert schema[f"decoder.layers.0.cross_attn.{p}.bias"] == (10,)
    assert schema["decoder.layers.0.self_attn.output.kernel"] == (10, 9)
    assert schema["decoder.layers.0.self_attn.output.bias"] == (9,)


def test_the_default_schema_and_initialisation_are_unchanged():
    config = TransformerConfig(**BASE)
    assert all(shape == (8, 8) for name, shape in weight_schema(config).items()
               if "attn." in name and name.endswith("kernel"))
    assert list(weight_schema(config))[:2] == ["src_embed.embeddings", "tgt_embed.embeddings"]


# -- masks and decoding ids -------------------------------------------------------------------------
def test_a_pad_start_token_is_a_real_key():
    tgt = np.array([[0, 4, 5, 0], [0, 0, 0, 0]])
    mask = make_tgt_mask(tgt, 0, first_is_real=True)
    keys = np.array([[True, True, True, False], [True, False, False, False]])
    np.testing.assert_array_equal(mask, keys[:, None, None, :] & np.tril(np.ones((4, 4), bool)))
    # The default keeps today's rule: a pad in column 0 is padding too.
    assert not make_tgt_mask(tgt, 0)[1].any()
    np.testing.assert_array_equal(make_tgt_mask(np.array([[1, 4, 0]]), 0, True),
                                  make_tgt_mask(np.array([[1, 4, 0]]), 0))


def test_the_search_may_start_from_pad_but_eos_must_not_be_pad():
    table = np.log(np.full((1, 4), 0.25))
    step = D.stateless_step(lambda prefix: np.repeat(table, len(prefix), 0), 4)
    result = D.greedy_search(step, 1, 3, bos_id=0, eos_id=2, pad_id=0)
    assert result.tokens.tolist() == [[1, 1, 1]]  # the lowest id among the ties, pad excluded
    with pytest.raises(ValueError, match="pad_id: expected an id different from eos_id, got 0"):
        D.beam_search(step, 1, 3, 2, bos_id=1, eos_id=0, pad_id=0)


def test_training_batches_start_with_the_start_token():
    _, tgt_in, tgt_out = tasks.batch_sequences([[5, 6]], [[7, 8]], start_id=tasks.PAD_ID)
    assert tgt_in.tolist() == [[tasks.PAD_ID, 7, 8]] and tgt_out.tolist() == [[7, 8, tasks.EOS_ID]]
    assert tasks.batch_sequences([[5]], [[7]])[1].tolist() == [[tasks.BOS_ID, 7]]


# -- the reference's formulas ---------------------------------------------------------------------
def test_activations_closed_forms():
    x = np.array([-30.0, -1.0, 0.0, 1.0, 2.5, 40.0])
    gelu = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    swish = np.array([v / (1 + math.exp(-v)) for v in x])
    np.testing.assert_allclose(R.ACTIVATIONS["gelu"](x), gelu, rtol=1e-15, atol=0)
    np.testing.assert_allclose(R.ACTIVATIONS["swish"](x), swish, rtol=1e-15, atol=1e-300)
    assert R.ACTIVATIONS["gelu"](np.array([1.0]))[0] == pytest.approx(0.8413447460685429, abs=1e-16)
    np.testing.assert_array_equal(R.ACTIVATIONS["relu"](x), np.maximum(x, 0))


def test_embedding_without_scale_and_with_learned_positions():
    config = TransformerConfig(**{**BASE, "positional": "learned", "embed_scale": False})
    weights = random_weights(config, 1)
    src, tgt = src_tgt(config, 2, 5, 4)
    _, trace = R.forward(weights, config, src, tgt, return_trace=True)
    np.testing.assert_array_equal(trace["encoder.embed"],
                                  weights["src_embed.embeddings"][src] + weights["src_embed.positions"][:5])
    np.testing.assert_array_equal(trace["decoder.embed"],
                                  weights["tgt_embed.embeddings"][tgt] + weights["tgt_embed.positions"][:4])


def test_head_dim_attention_is_the_per_head_formula():
    """Scores scaled by 1/sqrt(head_dim), heads of head_dim columns, concatenated to n_heads * head_dim."""
    rng = np.random.default_rng(0)
    d, h, k = 5, 2, 3
    w = {f"a.{p}.kernel": rng.normal(size=(d, h * k) if p != "output" else (h * k, d))
         for p in ("query", "key", "value", "output")}
    w.update({f"a.{p}.bias": rng.normal(size=h * k if p != "output" else d)
              for p in ("query", "key", "value", "output")})
    x = rng.normal(size=(1, 4, d))
    out, weights = R.attention(x, x, np.ones((1, 1, 4, 4), bool), w, "a", h, k)
    q, kk, v = (x[0] @ w[f"a.{p}.kernel"] + w[f"a.{p}.bias"] for p in ("query", "key", "value"))
    heads = []
    for i in range(h):
        cols = slice(i * k, (i + 1) * k)
        s = q[:, cols] @ kk[:, cols].T / math.sqrt(k)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        np.testing.assert_allclose(weights[0, i], a, rtol=1e-13)
        heads.append(a @ v[:, cols])
    expected = np.concatenate(heads, axis=1) @ w["a.output.kernel"] + w["a.output.bias"]
    np.testing.assert_allclose(out[0], expected, rtol=1e-13)


def test_the_reference_decodes_from_the_start_token():
    """Greedy decoding's first step is the forward pass on the start token alone, with the column-0
    rule when that token is pad."""
    for start in (0, 2, 7):
        config = TransformerConfig(**{**BASE, "decoder_start_id": start})
        model = R.Model(random_weights(config, 2), config)
        src, _ = src_tgt(config, 2, 5, 4)
        result = R.greedy_decode(model, src, 1)
        logits = R.forward(model.w, config, src, np.full((2, 1), start))
        np.testing.assert_array_equal(result.tokens[:, 0], np.argmax(np.where(
            np.arange(13) == config.pad_id, -np.inf, logits[:, 0]), axis=-1))


def test_without_padding_masks_pad_is_an_ordinary_token():
    """mask_padding=False: the default masks are all-True for the source and the subsequent mask
    for the target, so a padded batch computes as if pad were any token (KerasHub without
    mask_zero); unpadded input computes as the default model, bit for bit."""
    config = TransformerConfig(**BASE)
    unmasked = config.replace(mask_padding=False)
    w = random_weights(config, 3)
    src, tgt = src_tgt(config, 3, 6, 5, seed=1, src_lengths=[6, 3, 0], tgt_lengths=[5, 2, 1])
    all_keys = np.ones((3, 1, 1, 6), dtype=bool)
    causal = np.broadcast_to(np.tril(np.ones((5, 5), dtype=bool)), (3, 1, 5, 5))
    np.testing.assert_array_equal(R.forward(w, unmasked, src, tgt),
                                  R.forward(w, config, src, tgt, src_mask=all_keys, tgt_mask=causal))
    assert np.abs(R.forward(w, unmasked, src, tgt) - R.forward(w, config, src, tgt))[1:].max() > 1e-3
    full_src, full_tgt = src_tgt(config, 2, 6, 5, seed=2, src_lengths=[6, 6], tgt_lengths=[5, 5])
    np.testing.assert_array_equal(R.forward(w, unmasked, full_src, full_tgt),
                                  R.forward(w, config, full_src, full_tgt))
    with pytest.raises(ValueError, match="mask_padding: expected a bool, got 0"):
        config.replace(mask_padding=0)


def test_fields_are_dataclass_fields_in_order():
    names = [f.name for f in dataclasses.fields(TransformerConfig)]
    assert names[-len(NEW_FIELDS):] == list(NEW_FIELDS)  # appended: positional construction unchanged
