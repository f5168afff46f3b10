"""Hugging Face Marian (OPUS-MT) in and out, against the real transformers library: random-weight
``MarianMTModel``s saved with ``save_pretrained``, imported, and compared with the model's own
forward pass (reference, torch_impl and tf_impl; float64 at 1e-12, float32 within the measured
bound), greedy tokens against ``generate``; exported back and loaded by ``from_pretrained`` with
no missing or unused weight; project -> Marian -> project byte for byte."""
import importlib.util
import json
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parity_tests import hf_models as H  # noqa: E402
from parity_tests import interop_cases as C  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.exporters import ExportError, to_marian  # noqa: E402
from shared.importers import ImporterError, from_marian  # noqa: E402
from shared.importers.hf import IGNORED  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, max_rel_diff  # noqa: E402
from shared.weights import random_weights  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

BASE = dict(d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=32)
# Heads, depths, widths, vocabularies, pad ids (never 0 but in the last case), activations, scaling
# and the three tyings differ between cases, so that a swapped setting cannot pass.
CASES = {
    # OPUS-MT's shape: one shared table tied to the output, pad = last id = start, swish, scaled
    "shared-swish": dict(BASE, vocab_size=29, pad_token_id=28, eos_token_id=0, decoder_start_token_id=28,
                         activation_function="swish", scale_embedding=True),
    # separate vocabularies, untied output, relu, unscaled, pad inside the vocabulary
    "separate-relu": dict(BASE, d_model=24, encoder_layers=1, decoder_layers=2, encoder_attention_heads=3,
                          decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40,
                          vocab_size=23, decoder_vocab_size=27, share_encoder_decoder_embeddings=False,
                          tie_word_embeddings=False, pad_token_id=3, eos_token_id=1,
                          decoder_start_token_id=3, activation_function="relu", scale_embedding=False),
    # separate tables, output tied to the decoder's, gelu, a BOS start (decoder_start_id None)
    "tied-gelu": dict(BASE, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                      decoder_attention_heads=2, vocab_size=25, decoder_vocab_size=31,
                      share_encoder_decoder_embeddings=False, tie_word_embeddings=True, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                      activation_function="gelu", scale_embedding=True),
}


def case(name: str, dtype: str):
    model, path = C.saved("marian", name, dtype, tuple(sorted(CASES[name].items())))
    config, weights = from_marian(path)
    return model, path, config, weights


# -- import ----------------------------------------------------------------------------------------
def test_settings_map_onto_the_config():
    _, _, config, _ = case("shared-swish", "float64")
    assert (config.share_embeddings, config.tie_output, config.activation, config.embed_scale) == (True, True, "swish", True)
    assert (config.pad_id, config.eos_id, config.bos_id, config.decoder_start_id) == (28, 0, 0, 28)
    assert (config.pe_layout, config.pe_timescale, config.pe_offset, config.norm_eps) == ("halves", "paper", 0, 1e-5)
    assert (config.norm_first, config.final_norm, config.max_len, config.dtype) == (False, False, 32, "float64")
    _, _, config, weights = case("separate-relu", "float64")
    assert (config.src_vocab, config.tgt_vocab, config.n_heads, config.d_ff) == (23, 27, 3, 40)
    assert (config.share_embeddings, config.tie_output, config.embed_scale) == (False, False, False)
    assert "generator.kernel" in weights and "tgt_embed.embeddings" in weights
    _, _, config, weights = case("tied-gelu", "float64")
    assert (config.share_embeddings, config.tie_output, config.decoder_start_id, config.bos_id) == (False, True, None, 1)
    assert "generator.kernel" not in weights


@pytest.mark.parametrize("impl", C.IMPLS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_equal_the_source_forward(name, dtype, impl):
    model, _, config, weights = case(name, dtype)
    src, tgt = C.batch(config, seed=1)
    expected = H.hf_logits(model, src, tgt, config.pad_id, config.start_id == config.pad_id)
    actual = C.adapter(impl, config, weights, ("marian", name, dtype)).logits(src, tgt)
    assert_close(actual, expected, C.bound(dtype, impl), f"{name} {impl} logits")


@pytest.mark.parametrize("dtype, impl", [("float64", i) for i in C.IMPLS] + [("float32", "reference"),
                                                                           ("float32", "torch")])
def test_greedy_tokens_equal_generate(dtype, impl):
    """Every case in float64 (TF: one, its decoders compile per model, seconds each); the
    OPUS-MT-shaped one in float32 too (what users run)."""
    distinct = set()
    names = sorted(CASES) if impl != "tf" else ["separate-relu"]
    for name in names if dtype == "float64" else ["shared-swish"]:
        model, _, config, weights = case(name, dtype)
        src = C.sources(config)
        expected = H.hf_greedy(model, src, 9, config.pad_id)
        actual = C.adapter(impl, config, weights, ("marian", name, dtype)).greedy(src, 9).tokens
        np.testing.assert_array_equal(actual, expected, err_msg=f"{name} {impl} {dtype}")
        distinct.add(len({tuple(r) for r in expected}))
    assert max(distinct) > 1, "degenerate cases: every source decodes alike in each"


def test_transformers_float32_table_in_a_float64_model():
    """transformers builds its table through float32 even in float64: accepted (a table is only
    checked), and the model then differs from the exact one by float32 rounding only."""
    model = H.make_marian(0, "float64", exact_tables=False, **CASES["shared-swish"])
    assert model.model.encoder.embed_positions.weight.dtype == torch.float64
    _, _, config, weights = case("shared-swish", "float64")
    src, tgt = C.batch(config, seed=1)
    expected = H.hf_logits(model, src, tgt, config.pad_id, True)
    diff = max_rel_diff(R.forward(weights, config, src, tgt), expected)
    assert 1e-12 < diff < C.bound("float32", "reference").rtol


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_an_all_padding_source_row(attention):
    """The one input where transformers' attention implementations part: eager adds finfo.min to
    every score (a uniform row over padding), sdpa (the default) gives a zero context, as the
    project does (convention 3). The other rows are equal either way."""
    _, path, config, weights = case("shared-swish", "float64")
    model = transformers.MarianMTModel.from_pretrained(str(path), attn_implementation=attention).eval()
    H.exact_tables_(model, "marian")
    src, tgt = C.batch(config, seed=1)
    src[2] = config.pad_id
    expected = H.hf_logits(model, src, tgt, config.pad_id, True)
    actual = R.forward(weights, config, src, tgt)
    assert_close(actual[:2], expected[:2], FLOAT64, "rows with a real token")
    if attention == "sdpa":
        assert_close(actual[2], expected[2], FLOAT64, "the all-padding row")
    else:
        assert max_rel_diff(actual[2], expected[2]) > 1e-3


# -- export ------------------------------------------------------------------------------------------
def load_export(path):
    model, info = transformers.MarianMTModel.from_pretrained(str(path), output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(),
                    "error_msgs": []}, info
    return model.eval()


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_project_marian_project_is_byte_identical(name, tmp_path):
    _, _, config, weights = case(name, "float64")
    to_marian(tmp_path / "m", config, weights)
    back_config, back = from_marian(tmp_path / "m")
    assert back_config == config
    assert sorted(back) == sorted(weights)
    for key in weights:
        assert back[key].dtype == weights[key].dtype and back[key].tobytes() == weights[key].tobytes(), key


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_exported_model_loads_cleanly_and_computes_the_project_logits(dtype, tmp_path):
    """A project model with every tensor random, Marian-shaped: transformers runs it."""
    config = TransformerConfig(src_vocab=21, tgt_vocab=21, d_model=16, n_heads=2, d_ff=20,
                               n_encoder_layers=1, n_decoder_layers=2, max_len=24, norm_eps=1e-5,
                               pe_layout="halves", activation="swish", share_embeddings=True,
                               tie_output=True, pad_id=20, eos_id=0, bos_id=0, decoder_start_id=20,
                               dtype=dtype)
    weights = random_weights(config, 3)
    to_marian(tmp_path / "m", config, weights)
    model = load_export(tmp_path / "m")
    assert model.dtype == H.TORCH_DTYPES[dtype]
    src, tgt = C.batch(config, seed=2)
    assert_close(H.hf_logits(model, src, tgt, config.pad_id, True), R.forward(weights, config, src, tgt),
                 C.bound(dtype, "reference"), "transformers logits of the export")
    if dtype == "float64":
        src = C.sources(config)
        np.testing.assert_array_equal(
            H.hf_greedy(model, src, 8, config.pad_id), R.greedy_decode(R.Model(weights, config), src, 8).tokens)
        with torch.no_grad():  # generate with the exported generation_config alone
            plain = model.generate(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != 20),
                                   num_beams=1, do_sample=False, max_new_tokens=8).numpy()
        np.testing.assert_array_equal(plain[:, 1:], H.hf_greedy(model, src, 8, 20)[:, : plain.shape[1] - 1])
        # beam search too, given alpha 0 at the call (transformers' default length_penalty, 1.0,
        # chose other hypotheses; the export leaves it out: `generation_config`)
        want = R.beam_search(R.Model(weights, config), src, 8, beam_size=3)
        with torch.no_grad():
            beams = model.generate(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != 20),
                                   num_beams=3, length_penalty=0.0, do_sample=False, max_new_tokens=8).numpy()
        for row, tokens, length in zip(beams[:, 1:], want.tokens, want.lengths):
            np.testing.assert_array_equal(row[:length], tokens[:length])


def test_shared_untied_exports_as_two_equal_tables(tmp_path, capsys):
    config = TransformerConfig(src_vocab=19, tgt_vocab=19, d_model=16, n_heads=4, d_ff=24,
                               n_encoder_layers=1, n_decoder_layers=1, max_len=20, norm_eps=1e-5,
                               pe_layout="halves", share_embeddings=True, tie_output=False, dtype="float64")
    weights = random_weights(config, 1)
    to_marian(tmp_path / "m", config, weights)
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (hf["share_encoder_decoder_embeddings"], hf["tie_word_embeddings"]) == (False, False)
    model = load_export(tmp_path / "m")
    src, tgt = C.batch(config)
    assert_close(H.hf_logits(model, src, tgt, config.pad_id, False), R.forward(weights, config, src, tgt),
                 FLOAT64, "logits")
    back_config, back = from_marian(tmp_path / "m")
    assert not back_config.share_embeddings
    np.testing.assert_array_equal(back["tgt_embed.embeddings"], weights["src_embed.embeddings"])
    # --verify takes the second table for what it is (it reported the weights as DIFFERing)
    from shared.weights import save_checkpoint
    from twins.cli import main
    save_checkpoint(tmp_path / "ckpt", config, weights)
    capsys.readouterr()  # this test's own loads above
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "v"), "--to", "marian", "--verify"]) == 0
    out, err = capsys.readouterr()
    assert "(the shared embedding table written twice, equal)" in out
    assert "Loading weights" not in err  # transformers' own bar, amid the table (it was shown)


def test_export_refuses_what_marian_cannot_express_and_writes_nothing(tmp_path):
    config = TransformerConfig.preset("tiny").replace(norm_style="annotated", norm_first=True)
    with pytest.raises(ExportError) as info:
        to_marian(tmp_path / "m", config, random_weights(config))
    text = str(info.value)
    for field in ("norm_style: expected 'standard'", "norm_eps: expected 1e-05", "norm_first: expected False",
                  "final_norm: expected False", "pe_layout: expected 'halves'"):
        assert field in text
    learned = TransformerConfig.preset("tiny").replace(positional="learned")
    with pytest.raises(ExportError, match="positional: expected 'sinusoidal'"):
        to_marian(tmp_path / "m", learned, random_weights(learned))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    ok = TransformerConfig.preset("tiny").replace(norm_eps=1e-5, pe_layout="halves", norm_style="standard",
                                                  norm_first=False)
    with pytest.raises(FileExistsError, match="is not a Marian export"):
        to_marian(tmp_path / "other", ok, random_weights(ok))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    # a Marian model transformers saved holds the export's three files (config.json saying marian):
    # it was replaced, a user's OPUS-MT model deleted
    to_marian(tmp_path / "ours", ok, random_weights(ok))
    loaded = load_export(tmp_path / "ours")
    loaded.generation_config.validate(strict=True)  # what transformers 5.17 to 5.22 check on saving
    loaded.save_pretrained(tmp_path / "saved")
    before = {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    with pytest.raises(FileExistsError, match="is not a Marian export"):
        to_marian(tmp_path / "saved", ok, random_weights(ok, 1))
    assert {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()} == before
    to_marian(tmp_path / "ours", ok, random_weights(ok, 1))  # an earlier export is replaced


# -- what the importer refuses --------------------------------------------------------------------
@pytest.fixture
def marian_dir(tmp_path):
    import shutil
    _, path, _, _ = case("separate-relu", "float32")
    shutil.copytree(path, tmp_path / "m")
    return tmp_path / "m"


@settings(max_examples=12)
@given(data=st.data())
def test_random_settings_import_exactly_or_are_refused(data):
    """Marian models of random settings (sizes, both vocabularies, sharing and tying, the special
    ids with or without a BOS, activation, scaling), float64, saved by transformers: the import's
    logits equal the model's own forward pass within the float64 bound at every position the
    project's masks agree on, and it refuses exactly what transformers builds inconsistently (a
    shared table of two vocabulary sizes) or the project cannot express (EOS equal to pad, named
    as eos_token_id: `test_an_eos_that_is_pad_is_named_as_eos`)."""
    draw = data.draw
    heads = draw(st.sampled_from([1, 2, 4]))
    d_model = heads * draw(st.sampled_from([4, 8] if heads == 1 else [2, 4]))
    share = draw(st.booleans())
    vocab, decoder_vocab = draw(st.integers(5, 20)), draw(st.none() | st.integers(5, 20))
    pad, eos, start = (draw(st.integers(0, 4)) for _ in range(3))
    ffn = draw(st.integers(1, 16))
    marian = dict(vocab_size=vocab, decoder_vocab_size=decoder_vocab, d_model=d_model,
                  encoder_layers=draw(st.integers(1, 2)), decoder_layers=draw(st.integers(1, 2)),
                  encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                  decoder_ffn_dim=ffn, max_position_embeddings=draw(st.integers(8, 20)),
                  tie_word_embeddings=draw(st.booleans()), share_encoder_decoder_embeddings=share,
                  pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=start,
                  activation_function=draw(st.sampled_from(["relu", "gelu", "swish"])),
                  scale_embedding=draw(st.booleans()))
    if draw(st.booleans()):
        marian["bos_token_id"] = draw(st.integers(0, 4))
    model = H.make_marian(draw(st.integers(0, 99)), "float64", **marian)
    two_sizes = share and decoder_vocab not in (None, vocab)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        if two_sizes or eos == pad:
            why = ("decoder_vocab_size: expected vocab_size" if two_sizes
                   else "eos_token_id: expected an id different from pad")
            with pytest.raises(ImporterError, match=why):
                from_marian(folder)
            return
        config, weights = from_marian(folder)
    length = min(7, config.max_len)
    src, tgt = src_tgt(config, 3, length, length, seed=1)
    start_is_pad = config.start_id == pad
    real = (tgt != pad) | (np.arange(length) == 0) & start_is_pad  # positions both masks keep
    expected = H.hf_logits(model, src, tgt, pad, start_is_pad)
    assert_close(R.forward(weights, config, src, tgt)[real], expected[real], FLOAT64,
                 f"logits of {marian}")


def edit_config(path, **changes):
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


def refused(path, **kwargs) -> str:
    with pytest.raises(ImporterError) as info:
        from_marian(path, **kwargs)
    return str(info.value)


def test_refuses_directories_that_are_not_a_marian_save(marian_dir, tmp_path):
    with pytest.raises(FileNotFoundError):
        from_marian(tmp_path / "absent")
    (marian_dir / "model.safetensors").rename(tmp_path / "weights")
    assert "model.safetensors': missing" in refused(marian_dir)
    (marian_dir / "model.safetensors.index.json").write_text("{}")
    assert "sharded checkpoint" in refused(marian_dir)
    (marian_dir / "model.safetensors.index.json").unlink()
    (marian_dir / "pytorch_model.bin").write_bytes(b"not read")
    assert "a pickle, which this project never loads" in refused(marian_dir)
    (tmp_path / "weights").rename(marian_dir / "model.safetensors")
    edit_config(marian_dir, model_type="fsmt")
    assert "model_type expected 'marian' (MarianMTModel), got 'fsmt' (use --from fsmt" in refused(marian_dir)
    (marian_dir / "config.json").unlink()
    assert "config.json': missing" in refused(marian_dir)


def test_refuses_settings_it_cannot_map(marian_dir):
    edit_config(marian_dir, activation_function="gelu_new", decoder_attention_heads=1,
                normalize_before=True, my_new_switch=3, static_position_embeddings=True)
    text = refused(marian_dir)
    for part in ("activation_function: expected one of", "decoder_attention_heads: expected "
                 "encoder_attention_heads = 3", "normalize_before: expected false",
                 "unknown settings ['my_new_switch']"):
        assert part in text, text


def test_an_eos_that_is_pad_is_named_as_eos(marian_dir):
    """Marian has no BOS: without one the start id defaults to EOS, so an EOS equal to pad was
    refused as 'bos_token_id', a setting the file may not even hold."""
    data = json.loads((marian_dir / "config.json").read_text())
    edit_config(marian_dir, eos_token_id=data["pad_token_id"], bos_token_id=None)
    text = refused(marian_dir)
    assert (f"eos_token_id: expected an id different from pad_token_id={data['pad_token_id']}, "
            f"got {data['pad_token_id']}") in text and "bos_token_id" not in text, text


def test_refuses_a_positional_table_of_another_layout(marian_dir):
    from safetensors.numpy import load_file, save_file
    from shared.positional import positional_encoding
    tensors = load_file(str(marian_dir / "model.safetensors"))
    tensors["model.encoder.embed_positions.weight"] = positional_encoding(32, 24).astype(np.float32)
    tensors["model.decoder.embed_positions.weight"] = H.marian_table(32, 24)  # float64: accepted
    save_file(tensors, str(marian_dir / "model.safetensors"))
    text = refused(marian_dir)
    assert "model.encoder.embed_positions.weight: not Marian's sinusoidal table" in text
    assert "model.decoder" not in text


def test_a_tied_copy_must_equal_its_table(tmp_path):
    import shutil
    from safetensors.numpy import load_file, save_file
    _, path, _, weights = case("shared-swish", "float32")
    shutil.copytree(path, tmp_path / "m")
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.shared.weight"].copy()  # an older save: accepted
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    assert from_marian(tmp_path / "m")[1].keys() == weights.keys()
    tensors["lm_head.weight"][0, 0] += 1
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    assert "lm_head.weight: tied to model.shared.weight" in refused(tmp_path / "m")


def test_rename_maps_a_base_model_prefix(marian_dir):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(marian_dir / "model.safetensors"))
    save_file({k.replace("model.", "base.", 1): v for k, v in tensors.items()},
              str(marian_dir / "model.safetensors"))
    text = refused(marian_dir)
    assert "hint: unexpected keys that look like missing ones" in text and "'base.': 'model.'" in text
    assert from_marian(marian_dir, rename={"base.": "model."})[0].src_vocab == 23


def test_ignored_settings_cover_transformers_generic_keys():
    """Every key transformers writes for any model (PreTrainedConfig) or for generation is known
    to the importers: an upgrade that adds one shows here, not as a refused checkpoint."""
    generic = set(transformers.PreTrainedConfig().to_dict()) | set(transformers.GenerationConfig().to_dict())
    assert generic - IGNORED - {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"} == set()


# -- twins convert -----------------------------------------------------------------------------------
def test_convert_from_and_to_marian_with_verify(tmp_path, capsys):
    from twins.cli import main
    _, path, config, weights = case("separate-relu", "float32")
    assert main(["convert", str(path), str(tmp_path / "ckpt"), "--from", "marian", "--verify"]) == 0
    out = capsys.readouterr().out
    assert ("note: marian in transformers' eager attention (its default, sdpa, gives that row zero "
            "attention, as here) masks with a large negative score") in out
    assert "transformers:SRC vs reference:DST" in out and out.rstrip().endswith("PASS"), out
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "back"), "--to", "marian",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "reference:SRC vs transformers:DST" in out and "bit-identical" in out, out
    assert out.rstrip().endswith("PASS"), out
    assert from_marian(tmp_path / "back")[0] == config
    # widened to float64: transformers' float32 run is held to float32's bound (it failed on
    # float64's); to CTranslate2, whose distance from transformers is not measured: the reference
    # on the imported weights (it was a KeyError after writing)
    assert main(["convert", str(path), str(tmp_path / "wide"), "--from", "marian", "--dtype", "float64",
                 "--verify"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    if importlib.util.find_spec("ctranslate2"):
        assert main(["convert", str(path), str(tmp_path / "ct2"), "--from", "marian", "--to",
                     "ctranslate2", "--verify"]) == 0
        out = capsys.readouterr().out
        assert "ctranslate2:DST vs reference:SRC" in out and out.rstrip().endswith("PASS"), out


def test_convert_refusals_leave_nothing(tmp_path, capsys):
    from shared.weights import save_checkpoint
    from twins.cli import main
    tiny = TransformerConfig.preset("tiny")
    save_checkpoint(tmp_path / "tiny", tiny, random_weights(tiny))
    assert main(["convert", str(tmp_path / "tiny"), str(tmp_path / "m"), "--to", "marian"]) == 2
    err = capsys.readouterr().err
    assert "pe_layout: expected 'halves'" in err and not (tmp_path / "m").exists()
    assert main(["convert", str(tmp_path / "tiny"), str(tmp_path / "x"), "--rename", "a.=b."]) == 2
    assert "--rename: only for --from" in capsys.readouterr().err
    _, path, _, _ = case("shared-swish", "float32")
    assert main(["convert", str(path), str(tmp_path / "y"), "--from", "marian", "--n-heads", "2"]) == 2
    assert ("--n-heads: only for --from nn-transformer / annotated, not --from marian, which reads "
            "the config from the directory's config.json") in capsys.readouterr().err
    # The directory's config.json says marian: recognised without --from (shared.formats.hf).
    assert main(["convert", str(path), str(tmp_path / "z")]) == 0
    assert f"{path} (marian) -> " in capsys.readouterr().out


@pytest.mark.torch
@pytest.mark.tf
def test_decode_an_imported_marian_directory_in_both_backends(capsys):
    """`twins decode --checkpoint MARIAN_DIR`: recognised from its config.json, decoded from ids in
    torch and in tf, identical tokens and scores within the float32 bound (greedy: beam search's
    parity across backends is test_decoding.py's)."""
    from twins.cli import main
    _, path, config, _ = case("shared-swish", "float32")
    capsys.readouterr()  # transformers' progress lines, if it saved the case just now
    rows = ["5 6 7 8", "9 3 4"]
    results = {}
    for backend in ("torch", "tf"):
        for beam in ("1",):
            argv = ["decode", "--checkpoint", str(path), "--backend", backend, "--beam-size", beam,
                    "--max-new", "6", "--json", "-"]
            for row in rows:
                argv += ["--src", row]
            assert main(argv) == 0
            captured = capsys.readouterr()
            report = json.loads(captured.out)
            assert [r["src"] for r in report["results"]] == [[int(t) for t in r.split()] for r in rows]
            assert captured.err.splitlines() == [" ".join(map(str, r["tokens"])) for r in report["results"]]
            results[backend, beam] = report["results"]
    for beam in ("1",):
        torch_rows, tf_rows = results["torch", beam], results["tf", beam]
        assert [r["tokens"] for r in torch_rows] == [r["tokens"] for r in tf_rows]
        assert any(r["tokens"] for r in torch_rows)  # something was decoded
        from shared.tolerances import bound_for
        assert_close(np.array([r["score"] for r in tf_rows]), np.array([r["score"] for r in torch_rows]),
                     bound_for("float32", "torch:tf"), "decoded scores, tf vs torch")
