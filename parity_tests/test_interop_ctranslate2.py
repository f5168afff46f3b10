"""Export to CTranslate2 (`shared.exporters.ctranslate2`), tested on the real ``ctranslate2``.

Random-weight project models (every tensor random, EOS's output bias raised so that decodings stop
at different lengths) in four configs covering post/pre-norm (with and without a final norm),
relu/gelu/swish, interleaved/halves layouts, paper/t2t timescales with an offset, learned positions,
``embed_scale=False``, ``head_dim``, shared and tied tables, unequal vocabularies, pad not 0 and a
start token equal to pad (Marian) or EOS (FSMT). Each is exported, loaded with
``ctranslate2.Translator(dir, device="cpu", compute_type="float32")``, and compared with the
project:

* ``score_batch`` per-token log-probs against the float64 reference and torch_impl / tf_impl in
  float32, within the measured bounds of `shared.tolerances`;
* ``translate_batch`` greedy tokens (beam 1, under `X.GREEDY`) and lengths identical to the
  reference's and torch_impl's greedy on 3 configs x 50 sources, and to tf_impl's on one;
* the semantics that differ (min length, the end token, pad, empty sources), the refusals, crash
  safety, and ``twins convert --to ctranslate2``.
"""
import json
from pathlib import Path

import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

from shared import TransformerConfig  # noqa: E402
from shared.divergence import first_divergence  # noqa: E402
from shared.exporters import ctranslate2 as X  # noqa: E402
from shared.tolerances import assert_close, bound_for  # noqa: E402
from shared.weights import random_weights, save_checkpoint  # noqa: E402
from twins.backends import make_adapter  # noqa: E402

BATCH, SRC_LEN, TGT_LEN, MAX_LEN = 50, 9, 8, 12
SMALL = dict(dropout=0.0, norm_style="standard", max_len=16)
CONFIGS = {
    # the paper's post-norm, relu, interleaved paper table; unequal vocabularies, pad not 0
    "post-relu": TransformerConfig(src_vocab=11, tgt_vocab=13, d_model=16, n_heads=2, d_ff=24,
                                   n_encoder_layers=2, n_decoder_layers=2, norm_first=False,
                                   pad_id=3, bos_id=1, eos_id=2, norm_eps=1e-6, **SMALL),
    # Marian-like: pre-norm + final norm, swish, [sin | cos], shared and tied tables, start = pad;
    # t2t frequencies with fairseq's offset pad + 1
    "pre-swish-halves": TransformerConfig(src_vocab=12, tgt_vocab=12, d_model=16, n_heads=4, d_ff=32,
                                          n_encoder_layers=1, n_decoder_layers=2, norm_first=True,
                                          activation="swish", pe_layout="halves", pe_timescale="t2t",
                                          pe_offset=4, share_embeddings=True, tie_output=True,
                                          pad_id=3, bos_id=0, eos_id=2, decoder_start_id=3,
                                          norm_eps=1e-5, **SMALL),
    # nn.Transformer's post-norm + final norm, exact gelu, learned positions, no embedding scale,
    # head_dim * n_heads != d_model, start = EOS (FSMT)
    "post-final-gelu-learned": TransformerConfig(src_vocab=14, tgt_vocab=10, d_model=12, n_heads=3,
                                                 head_dim=5, d_ff=20, n_encoder_layers=2,
                                                 n_decoder_layers=1, norm_first=False, final_norm=True,
                                                 activation="gelu", positional="learned",
                                                 embed_scale=False, pad_id=1, bos_id=0, eos_id=2,
                                                 decoder_start_id=2, norm_eps=1e-5, **SMALL),
    # pre-norm without the final norm, a large eps (a wrong eps would show)
    "pre-nofinal-eps": TransformerConfig(src_vocab=9, tgt_vocab=11, d_model=8, n_heads=2, d_ff=16,
                                         n_encoder_layers=1, n_decoder_layers=1, norm_first=True,
                                         final_norm=False, pad_id=0, bos_id=1, eos_id=2, norm_eps=0.3,
                                         **SMALL),
}
GREEDY_CONFIGS = ["post-relu", "pre-swish-halves", "post-final-gelu-learned"]
# Added to EOS's output bias so that greedy rows stop at several lengths and some run out: measured
# at seed 0 on the 50 sources (post-relu 19 stop early / 31 run out, pre-swish-halves 31 / 19,
# post-final-gelu-learned 24 / 26).
EOS_BOOST = {"post-relu": 1.5, "pre-swish-halves": 0.0, "post-final-gelu-learned": 1.0}


# -- models, inputs and the project's side --------------------------------------------------------
def weights_for(name: str, seed: int = 0) -> dict:
    config = CONFIGS[name]
    w = random_weights(config, seed)
    w["generator.bias"][config.eos_id] += EOS_BOOST.get(name, 1.0)
    return w


def sequences(config, vocab: int, length: int, rng, end_with_eos: bool) -> np.ndarray:
    """(BATCH, length + 1) ids: 1..length ordinary tokens (not pad, BOS or EOS), then EOS on every
    other row when ``end_with_eos``, then pad."""
    ordinary = [i for i in range(vocab) if i not in (config.pad_id, config.bos_id, config.eos_id)]
    out = np.full((BATCH, length + 1), config.pad_id, np.int64)
    for b, n in enumerate(rng.integers(1, length + 1, size=BATCH)):
        out[b, :n] = rng.choice(ordinary, size=n)
        if end_with_eos and b % 2:
            out[b, n] = config.eos_id
    return out


def inputs(config):
    rng = np.random.default_rng(7)
    return (sequences(config, config.src_vocab, SRC_LEN, rng, True),
            sequences(config, config.tgt_vocab, TGT_LEN, rng, False))


def project_log_probs(adapter, config, src, tgt) -> np.ndarray:
    """The project's side of `X.score`, from one implementation's logits."""
    return X.project_scores(adapter.logits, config, src, tgt)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (config, weights, Translator), exported once."""
    out = {}
    for name, config in CONFIGS.items():
        w = weights_for(name)
        path = X.to_ctranslate2(config, w, tmp_path_factory.mktemp("ct2") / name)
        out[name] = (config, w, ctranslate2.Translator(str(path), device="cpu", compute_type="float32",
                                                       intra_threads=1))
    return out


_ADAPTERS = {}


def project(impl: str, name: str, config, w):
    """The reference holds the float32 weights exactly in float64; torch and TF run float32."""
    key = (impl, name)
    if key not in _ADAPTERS:
        if impl == "reference":
            config, w = config.replace(dtype="float64"), {k: v.astype(np.float64) for k, v in w.items()}
        _ADAPTERS[key] = make_adapter(impl, config, w)
    return _ADAPTERS[key]


MARKS = {"reference": [], "torch": [pytest.mark.torch], "tf": [pytest.mark.tf]}
IMPLS = [pytest.param(impl, marks=marks) for impl, marks in MARKS.items()]


def _need(impl):
    if impl != "reference":
        pytest.importorskip("torch" if impl == "torch" else "tensorflow")


# -- score_batch ----------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_score_batch_log_probs_match_the_project(exported, name, impl):
    _need(impl)
    config, w, translator = exported[name]
    src, tgt = inputs(config)
    got = X.score(translator, config, src, tgt)
    want = project_log_probs(project(impl, name, config, w), config, src, tgt)
    assert got.shape == want.shape == (BATCH, TGT_LEN + 2)
    assert (got[want == 0] == 0).all() and (got[want != 0] < 0).all()  # same positions scored
    assert_close(got, want, bound_for("float32", f"ctranslate2:{impl}"), f"{name} log-probs vs {impl}")


def test_eps_and_positions_are_the_configs(exported, tmp_path):
    """The two settings CTranslate2 would otherwise fill with its own: its default eps (1e-5) and
    its own sinusoidal table give log-probs far outside the bound, so the test above sees them."""
    from ctranslate2.specs import model_spec
    bound = bound_for("float32", "ctranslate2:reference").rtol
    for name, edit in (("pre-nofinal-eps", "eps"), ("post-relu", "table")):
        config, w, translator = exported[name]
        src, tgt = inputs(config)
        want = project_log_probs(project("reference", name, config, w), config, src, tgt)
        spec = X.build_spec(config, w)
        if edit == "eps":
            spec.config.layer_norm_epsilon = None  # CTranslate2's default
        else:  # CTranslate2 builds its own table when the variable is absent
            for stack in (spec.encoder, spec.decoder):
                stack.position_encodings.encodings = model_spec.OPTIONAL
        (tmp_path / edit).mkdir()
        spec.save(str(tmp_path / edit))
        other = ctranslate2.Translator(str(tmp_path / edit), compute_type="float32", intra_threads=1)
        diff = np.abs(X.score(other, config, src, tgt) - want).max()
        assert diff > 100 * bound * max(np.abs(want).max(), 1), (edit, diff)


# -- translate_batch: greedy ----------------------------------------------------------------------
# TF's greedy traces a compiled loop per model (about 3 s of CPU each here): one config for TF, all
# three for the reference (the definition) and torch.
GREEDY_CASES = [pytest.param(name, impl, marks=MARKS[impl]) for name, impl in
                [(n, i) for n in GREEDY_CONFIGS for i in ("reference", "torch")] + [("pre-swish-halves", "tf")]]


@pytest.mark.parametrize("name, impl", GREEDY_CASES)
def test_greedy_tokens_identical_on_50_sources(exported, name, impl):
    _need(impl)
    config, w, translator = exported[name]
    src, _ = inputs(config)
    tokens, lengths = X.greedy(translator, config, src, MAX_LEN)
    want = project(impl, name, config, w).greedy(src, MAX_LEN)
    parted = first_divergence(want.tokens, tokens)
    assert not parted, f"{len(parted)} of {BATCH} rows part from {impl}: " + "; ".join(map(str, parted[:3]))
    np.testing.assert_array_equal(lengths, want.lengths)
    assert (lengths < MAX_LEN).sum() >= 10 and (lengths == MAX_LEN).sum() >= 3, lengths  # both ends


def test_ctranslate2_defaults_differ_as_documented(exported, tmp_path):
    """Under CTranslate2's defaults the same model answers otherwise: EOS may not come first
    (min_decoding_length=1), the end token is dropped, and pad may be generated; `X.GREEDY` is
    what makes them coincide (the test above)."""
    name = "pre-swish-halves"
    config, w, translator = exported[name]
    src, _ = inputs(config)
    src = src[project("reference", name, config, w).greedy(src, MAX_LEN).lengths == 1]  # EOS first
    assert len(src) >= 10
    eos = X.token(config.eos_id)
    default = translator.translate_batch(X.source_tokens(config, src), beam_size=1, max_decoding_length=4)
    assert all(r.hypotheses[0] and r.hypotheses[0][0] != eos for r in default)
    ours = translator.translate_batch(X.source_tokens(config, src), max_decoding_length=4, **X.GREEDY)
    assert all(r.hypotheses[0] == [eos] for r in ours)
    dropped = translator.translate_batch(X.source_tokens(config, src), max_decoding_length=4,
                                         **dict(X.GREEDY, return_end_token=False))
    assert all(r.hypotheses[0] == [] for r in dropped)
    # pad: with an overwhelming pad bias CTranslate2 generates it unless disable_unk (= pad) is on
    w2 = dict(w, **{"generator.bias": w["generator.bias"].copy()})
    w2["generator.bias"][config.pad_id] = 50.0
    path = X.to_ctranslate2(config, w2, tmp_path / "pad-heavy")
    t2 = ctranslate2.Translator(str(path), compute_type="float32", intra_threads=1)
    plain = t2.translate_batch(X.source_tokens(config, src), beam_size=1, max_decoding_length=3)
    assert plain[0].hypotheses[0] == [X.token(config.pad_id)] * 3
    tokens, lengths = X.greedy(t2, config, src, 3)
    assert (lengths >= 1).all() and (tokens[:, 0] != config.pad_id).all()  # pad never generated


def test_empty_by_ctranslate2s_rule_and_inner_pad_are_refused(exported):
    config, _, translator = exported["post-relu"]
    e, b, p = config.eos_id, config.bos_id, config.pad_id
    for row in ([e], [b], [b, e], [e, 5], [b, e, 5]):
        assert X.ct2_skips(config, row)
        assert translator.translate_batch([[X.token(i) for i in row]], **X.GREEDY)[0].hypotheses[0] == []
        with pytest.raises(ValueError, match=r"src\[0\].*no content by CTranslate2's rule"):
            X.source_tokens(config, np.array([row + [p]]))
    assert not X.ct2_skips(config, [5, e]) and not X.ct2_skips(config, [b, 5])
    with pytest.raises(ValueError, match=rf"src\[1\]: pad_id={p} before the end of the row"):
        X.source_tokens(config, np.array([[4, 5, p], [4, p, 5]]))
    with pytest.raises(ValueError, match=r"src: expected ids in \[0, 11\), got 0\.\.11"):
        X.source_tokens(config, np.array([[0, 11]]))


# -- the directory: files, refusals, crash safety -------------------------------------------------
def test_directory_holds_the_model_and_id_vocabularies(exported, tmp_path):
    config = CONFIGS["pre-swish-halves"]
    path = X.to_ctranslate2(config, weights_for("pre-swish-halves"), tmp_path / "m")
    files = {p.name for p in path.iterdir()}
    assert files == {"model.bin", "config.json", "shared_vocabulary.json"}  # equal vocabularies
    assert json.loads((path / "shared_vocabulary.json").read_text()) == [str(i) for i in range(12)]
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["decoder_start_token"], cfg["unk_token"], cfg["eos_token"]) == ("3", "3", "2")
    assert cfg["layer_norm_epsilon"] == 1e-5
    assert not list(tmp_path.glob(".*"))  # no staging left
    other = {p.name for p in X.to_ctranslate2(CONFIGS["post-relu"], weights_for("post-relu"),
                                              tmp_path / "m").iterdir()}  # replaced
    assert other == {"model.bin", "config.json", "source_vocabulary.json", "target_vocabulary.json"}


@pytest.mark.parametrize("change, named", [
    (dict(norm_style="annotated"), "norm_style='annotated': CTranslate2's layer norm is the standard"),
    (dict(dtype="float64"), "dtype='float64': CTranslate2 stores and computes float32 at most"),
    # it was written, and a padded batch then decoded another source
    (dict(mask_padding=False), "mask_padding=False: CTranslate2 masks a batch's padding by length"),
])
def test_refused_configs_name_the_setting_and_write_nothing(tmp_path, change, named):
    config = CONFIGS["post-relu"].replace(**change)
    with pytest.raises(X.ExportError, match=named):
        X.to_ctranslate2(config, random_weights(config), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_failing_converter_leaves_no_directory(tmp_path, monkeypatch):
    """CTranslate2's own save failing halfway: neither the destination nor a staged copy remains,
    and an existing model directory is kept as it was."""
    from ctranslate2.specs import model_spec
    config = CONFIGS["post-relu"]

    def broken(self, output_dir):
        (Path(output_dir) / "model.bin").write_bytes(b"half")
        raise RuntimeError("disk full, say")

    monkeypatch.setattr(model_spec.ModelSpec, "save", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        X.to_ctranslate2(config, weights_for("post-relu"), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    X.to_ctranslate2(config, weights_for("post-relu"), tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    monkeypatch.setattr(model_spec.ModelSpec, "save", broken)
    with pytest.raises(RuntimeError):
        X.to_ctranslate2(config, weights_for("post-relu", 1), tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_an_other_directory_is_not_overwritten(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    config = CONFIGS["post-relu"]
    with pytest.raises(FileExistsError, match="is not a CTranslate2 model directory"):
        X.to_ctranslate2(config, weights_for("post-relu"), tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


# -- the command line -----------------------------------------------------------------------------
def test_twins_convert_to_ctranslate2_with_verify(tmp_path, capsys):
    from twins.cli import main
    config = CONFIGS["pre-swish-halves"]
    w = weights_for("pre-swish-halves")
    save_checkpoint(tmp_path / "ckpt", config, w)
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "ct2"), "--to", "ctranslate2",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "-> " + str(tmp_path / "ct2") + " (ctranslate2)" in out
    assert "ctranslate2:DST vs reference:SRC" in out and out.rstrip().endswith("PASS"), out
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), compute_type="float32")
    src, _ = inputs(config)
    np.testing.assert_array_equal(X.greedy(translator, config, src[:5], MAX_LEN)[0],
                                  project("reference", "pre-swish-halves", config, w).greedy(src[:5], MAX_LEN).tokens)
    # max_len=1: the start token alone is fed, so the score is EOS's (an empty target: IndexError)
    one = config.replace(max_len=1)
    save_checkpoint(tmp_path / "one", one, random_weights(one))
    assert main(["convert", str(tmp_path / "one"), str(tmp_path / "one.ct2"), "--to", "ctranslate2",
                 "--verify"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    # three source ids (pad, BOS, EOS) and max_len 2: the batch --verify drew held a row CTranslate2
    # does not run ([EOS, BOS]), and the command ended in an error naming a src the user never gave
    tiny = config.replace(src_vocab=3, tgt_vocab=3, max_len=2, pad_id=1, decoder_start_id=1)
    save_checkpoint(tmp_path / "tiny", tiny, random_weights(tiny))
    assert main(["convert", str(tmp_path / "tiny"), str(tmp_path / "tiny.ct2"), "--to", "ctranslate2",
                 "--verify"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_ctranslate2s_length_is_unsigned(tmp_path):
    """BOS equal to EOS: CTranslate2 counts ``[2, 5]`` as 2 - 1 (BOS) - 2 (EOS before a last
    token), a size_t that wraps, and runs the row; ct2_skips said it would not, and the decoding
    helpers refused the row as having "no content"."""
    config = CONFIGS["post-relu"].replace(bos_id=2, eos_id=2)
    translator = ctranslate2.Translator(str(X.to_ctranslate2(config, random_weights(config), tmp_path / "m")),
                                        compute_type="float32")
    for row in ([2, 5], [2, 1, 3], [5, 2, 4], [2], [2, 2], [2, 5, 2]):
        runs = translator.translate_batch([[X.token(i) for i in row]], max_decoding_length=3,
                                          **X.GREEDY)[0].hypotheses[0] != []
        assert X.ct2_skips(config, row) == (not runs), row
    tokens, _ = X.greedy(translator, config, np.array([[2, 5]]), 3)
    assert tokens.shape == (1, 3)


def test_the_helpers_name_lengths_the_positional_table_cannot_take(tmp_path):
    """Before: CTranslate2's own "No position encodings are defined for positions >= 4" and "The
    maximum decoding length must be > 0"; torch_impl names the argument in the same cases."""
    config = CONFIGS["post-relu"].replace(max_len=4)
    translator = ctranslate2.Translator(str(X.to_ctranslate2(config, random_weights(config), tmp_path / "m")),
                                        compute_type="float32")
    src = np.array([[4, 5]])
    for call, message in (
            (lambda: X.greedy(translator, config, src, 5), r"max_len: expected at most config.max_len=4"),
            (lambda: X.greedy(translator, config, src, 0), r"max_len: expected an int >= 1, got 0"),
            (lambda: X.greedy(translator, config, np.full((1, 5), 4), 2), r"src: expected at most max_len=4 tokens"),
            (lambda: X.score(translator, config, src, np.full((1, 4), 4)),
             r"tgt: expected at most config.max_len - 1 = 3 tokens \(they follow the start token\), got 4")):
        with pytest.raises(ValueError, match=f"^{message}"):
            call()
    assert X.score(translator, config, src, np.full((1, 3), 4)).shape == (1, 4)


def test_twins_convert_refusal_is_one_line(tmp_path, capsys):
    from twins.cli import main
    config = CONFIGS["post-relu"].replace(norm_style="annotated")
    save_checkpoint(tmp_path / "ckpt", config, random_weights(config))
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "ct2"), "--to", "ctranslate2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twins convert: error: to_ctranslate2: config: 1 problem(s)") and "norm_style" in err
    assert not (tmp_path / "ct2").exists()
