"""Importers: real PyTorch source models with random weights, imported, give the same logits as
the float64 oracle; everything the canonical model cannot compute identically is refused."""
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from parity_tests import source_models as S  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for, max_rel_diff  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.importers import ImporterError, from_annotated, from_nn_transformer  # noqa: E402
from shared.positional import positional_encoding  # noqa: E402

pytestmark = [pytest.mark.torch,
              # nn.TransformerEncoder's eval fast path (batch_first, padding) converts to nested tensors
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]

# The tutorial's special ids are UNK 0, PAD 1, BOS 2, EOS 3. Sizes differ on purpose (vocabularies,
# layer counts, d_ff != d_model) so that a swapped size cannot pass.
NN = dict(n_heads=4, pad_id=1, bos_id=2, eos_id=3)
NN_SIZES = dict(num_encoder_layers=2, num_decoder_layers=3, emb_size=16, nhead=4, src_vocab_size=11,
                tgt_vocab_size=13, dim_feedforward=24, maxlen=32)
ANN = dict(n_heads=4, pad_id=0, bos_id=1, eos_id=2)
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def nn_model(norm_first=False, batch_first=False, dtype="float64", seed=0, activation="relu"):
    model = S.Seq2SeqTransformer(**NN_SIZES, norm_first=norm_first, batch_first=batch_first,
                                 dtype=TORCH_DTYPES[dtype], activation=activation)
    return S.randomize_(model, seed)


def annotated_model(dtype="float64", seed=0, src_vocab=11):
    model = S.make_annotated(src_vocab=src_vocab, tgt_vocab=13, n=2, d_model=16, d_ff=24, h=4, max_len=32,
                             dtype=TORCH_DTYPES[dtype])
    return S.randomize_(model, seed)


def batch(config, seed=0):
    """Batch of 3; rows 2 and 3 of source and target padded (row 1 full)."""
    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=6, seed=seed)
    assert (src == config.pad_id).any() and (tgt == config.pad_id).any()
    return src, tgt


def float32_bound_or_skip(measured: float):
    try:
        return bound_for("float32", "torch:reference")
    except KeyError:
        pytest.skip(f"no float32 torch:reference bound in tolerances.py yet; measured max relative "
                    f"difference {measured:.3e}")


# -- nn.Transformer (tutorial Seq2SeqTransformer) -------------------------------------------------
@pytest.mark.parametrize("mask_style", ["bool", "float"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_nn_transformer_logits_float64(norm_first, batch_first, mask_style):
    model = nn_model(norm_first, batch_first)
    config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=norm_first, **NN)
    assert (config.d_model, config.d_ff, config.n_encoder_layers, config.n_decoder_layers) == (16, 24, 2, 3)
    assert (config.src_vocab, config.tgt_vocab, config.max_len) == (11, 13, 32)
    assert config.final_norm and config.norm_first == norm_first and config.norm_eps == 1e-5
    assert config.norm_style == "standard" and config.dtype == "float64"
    src, tgt = batch(config)
    expected = S.nn_transformer_logits(model, src, tgt, config.pad_id, mask_style)
    assert_close(R.forward(weights, config, src, tgt), expected, FLOAT64, "logits")


def test_nn_transformer_with_gelu_imports_as_the_exact_gelu():
    """nn.Transformer(activation="gelu") is F.gelu, the erf form the config's "gelu" computes: it
    was refused as if the canonical model had relu alone."""
    model = nn_model(activation="gelu")
    config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=False, activation="gelu", **NN)
    assert config.activation == "gelu"
    src, tgt = batch(config)
    expected = S.nn_transformer_logits(model, src, tgt, config.pad_id, "bool")
    assert_close(R.forward(weights, config, src, tgt), expected, FLOAT64, "logits")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_nn_transformer_logits_float32(norm_first):
    model = nn_model(norm_first, dtype="float32")
    config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=norm_first, **NN)
    assert config.dtype == "float32" and all(w.dtype == np.float32 for w in weights.values())
    src, tgt = batch(config)
    expected = S.nn_transformer_logits(model, src, tgt, config.pad_id)
    actual = R.forward(weights, config, src, tgt)
    assert_close(actual, expected, float32_bound_or_skip(max_rel_diff(expected, actual)), "logits")


def test_wrong_norm_first_computes_something_else():
    """Why ``norm_first`` is a required argument: the weights cannot tell, the logits can."""
    model = nn_model(norm_first=False)
    config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=True, **NN)
    src, tgt = batch(config)
    expected = S.nn_transformer_logits(model, src, tgt, config.pad_id)
    assert max_rel_diff(R.forward(weights, config, src, tgt), expected) > 1e-3


def test_parity_check_detects_a_swapped_tensor():
    """Every tensor is random, so swapping two of the same shape breaks parity."""
    model = nn_model()
    config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=False, **NN)
    src, tgt = batch(config)
    expected = S.nn_transformer_logits(model, src, tgt, config.pad_id)
    for a, b in [("decoder.layers.1.cross_attn.query.kernel", "decoder.layers.1.cross_attn.key.kernel"),
                 ("encoder.layers.0.ffn_norm.gamma", "encoder.layers.0.ffn_norm.beta"),
                 ("decoder.final_norm.beta", "decoder.layers.2.ffn.outer.bias")]:
        swapped = {**weights, a: weights[b], b: weights[a]}
        assert max_rel_diff(R.forward(swapped, config, src, tgt), expected) > 1e-6, (a, b)


def test_dtype_cast_and_no_aliasing():
    sd = S.numpy_state_dict(nn_model(dtype="float32"))
    config, weights = from_nn_transformer(sd, norm_first=False, dtype="float64", **NN)
    assert config.dtype == "float64"
    np.testing.assert_array_equal(weights["generator.bias"], sd["generator.bias"].astype(np.float64))
    np.testing.assert_array_equal(weights["generator.kernel"], sd["generator.weight"].T)
    _, weights32 = from_nn_transformer(sd, norm_first=False, **NN)
    sd["generator.bias"][:] = 7.0
    assert not (weights32["generator.bias"] == 7.0).any()  # copies, not views of the source


def test_in_proj_is_split_query_key_value():
    sd = S.numpy_state_dict(nn_model())
    _, w = from_nn_transformer(sd, norm_first=False, **NN)
    packed = sd["transformer.decoder.layers.0.multihead_attn.in_proj_weight"]  # (3d, d)
    for i, p in enumerate(("query", "key", "value")):
        rows = packed[16 * i:16 * (i + 1)]  # torch (out, in) rows of this projection
        np.testing.assert_array_equal(w[f"decoder.layers.0.cross_attn.{p}.kernel"], rows.T)


def test_missing_positional_table_needs_max_len():
    model = nn_model()
    sd = S.numpy_state_dict(model)
    del sd["positional_encoding.pos_embedding"]  # as from a non-persistent buffer
    with pytest.raises(ImporterError, match="pass max_len"):
        from_nn_transformer(sd, norm_first=False, **NN)
    config, weights = from_nn_transformer(sd, norm_first=False, max_len=20, **NN)
    assert config.max_len == 20
    src, tgt = batch(config)
    assert_close(R.forward(weights, config, src, tgt),
                 S.nn_transformer_logits(model, src, tgt, config.pad_id), FLOAT64, "logits")


def test_max_len_may_not_exceed_the_table():
    with pytest.raises(ImporterError, match="max_len: expected at most 32"):
        from_nn_transformer(S.numpy_state_dict(nn_model()), norm_first=False, max_len=33, **NN)


# -- refusals -------------------------------------------------------------------------------------
def refused(fn, sd, **kwargs) -> ImporterError:
    with pytest.raises(ImporterError) as info:
        fn(sd, **kwargs)
    return info.value


@pytest.fixture
def nn_sd():
    return S.numpy_state_dict(nn_model(dtype="float32"))


def test_refuses_missing_key(nn_sd):
    del nn_sd["transformer.decoder.layers.1.linear2.bias"]
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "missing keys: ['transformer.decoder.layers.1.linear2.bias']" in str(err)


def test_refuses_unexpected_key(nn_sd):
    nn_sd["transformer.encoder.layers.0.self_attn.bias_k"] = np.zeros((1, 1, 16), np.float32)
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "unexpected keys: ['transformer.encoder.layers.0.self_attn.bias_k']" in str(err)


def test_refuses_wrong_shape(nn_sd):
    nn_sd["generator.bias"] = np.zeros(5, np.float32)
    nn_sd["transformer.encoder.layers.1.self_attn.in_proj_weight"] = np.zeros((16, 16), np.float32)
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "generator.bias: expected shape (13,), got (5,)" in str(err)
    assert ("transformer.encoder.layers.1.self_attn.in_proj_weight: expected shape (48, 16), "
            "got (16, 16)") in str(err)


@pytest.mark.parametrize("n_heads", [3, 0, 2.0])
def test_refuses_bad_n_heads(nn_sd, n_heads):
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **{**NN, "n_heads": n_heads})
    assert "n_heads: expected" in str(err)


def other_tables(max_len, d):
    p = np.arange(max_len, dtype=np.float64)[:, None]
    angle = p * np.power(10000.0, -np.arange(0, d, 2) / d)
    interleaved = positional_encoding(max_len + 1, d)
    return {
        "concatenated_sin_cos": np.concatenate([np.sin(angle), np.cos(angle)], axis=1),
        "positions_from_1": interleaved[1:],
        "cos_sin": interleaved[:-1][:, [i ^ 1 for i in range(d)]],
        "learned": np.random.default_rng(0).normal(size=(max_len, d)),
    }


@pytest.mark.parametrize("layout", sorted(other_tables(4, 4)))
def test_refuses_positional_table_of_another_layout(nn_sd, layout):
    table = other_tables(32, 16)[layout]
    nn_sd["positional_encoding.pos_embedding"] = table[:, None, :].astype(np.float32)
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "positional_encoding.pos_embedding: not the interleaved sinusoidal table" in str(err)


def test_refuses_non_float_and_mixed_dtypes(nn_sd):
    nn_sd["generator.bias"] = nn_sd["generator.bias"].astype(np.int64)
    nn_sd["transformer.encoder.norm.weight"] = nn_sd["transformer.encoder.norm.weight"].astype(np.float64)
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "generator.bias: expected a floating-point tensor, got dtype int64" in str(err)
    assert "mixed dtypes" in str(err) and "transformer.encoder.norm.weight" in str(err)


def test_refuses_torch_tensors_nan_and_float16_without_dtype(nn_sd):
    nn_sd["generator.weight"] = torch.zeros(13, 16)
    nn_sd["transformer.decoder.norm.bias"][3] = np.nan
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert "generator.weight: expected a numpy array, got Tensor" in str(err)
    assert "transformer.decoder.norm.bias: contains NaN or Inf" in str(err)
    half = {k: v.astype(np.float16) for k, v in S.numpy_state_dict(nn_model()).items()}
    assert "pass dtype='float32'" in str(refused(from_nn_transformer, half, norm_first=False, **NN))
    assert from_nn_transformer(half, norm_first=False, dtype="float32", **NN)[0].dtype == "float32"
    err = refused(from_nn_transformer, half, norm_first=False, dtype="float16", **NN)
    assert "dtype: expected one of ('float32', 'float64') or None, got 'float16'" in str(err)
    # "float" is float64 to NumPy and float32 to torch: neither is assumed (before: float64)
    for spelling in ("float", float, "f8", "double", torch.float32):
        err = refused(from_nn_transformer, half, norm_first=False, dtype=spelling, **NN)
        assert f"dtype: expected one of ('float32', 'float64') or None, got {spelling!r}" in str(err)
    assert from_nn_transformer(half, norm_first=False, dtype=np.float64, **NN)[0].dtype == "float64"


def test_refuses_bias_less_model(nn_sd):
    sd = {k: v for k, v in nn_sd.items() if not (k.startswith("transformer.") and k.endswith("bias"))}
    err = refused(from_nn_transformer, sd, norm_first=False, **NN)
    assert "bias=False cannot be imported" in str(err)


def test_refuses_other_activation_and_reports_every_problem_at_once(nn_sd):
    del nn_sd["transformer.encoder.layers.0.linear1.bias"]
    nn_sd["extra"] = np.zeros(1, np.float32)
    err = refused(from_nn_transformer, nn_sd, norm_first=False, activation="swish", **{**NN, "n_heads": 5})
    assert len(err.problems) == 4, err.problems
    for text in ("activation: expected 'relu' or 'gelu'", "n_heads: expected a divisor of d_model=16, got 5",
                 "missing keys: ['transformer.encoder.layers.0.linear1.bias']", "unexpected keys: ['extra']"):
        assert text in str(err)


def test_refuses_the_other_layout():
    ann = S.numpy_state_dict(annotated_model())
    assert "use from_annotated" in str(refused(from_nn_transformer, ann, norm_first=True, **NN))
    nn_sd = S.numpy_state_dict(nn_model())
    assert "use from_nn_transformer" in str(refused(from_annotated, nn_sd, **ANN))
    bare = {k.removeprefix("transformer."): v for k, v in nn_sd.items()}
    assert "bare nn.Transformer" in str(refused(from_nn_transformer, bare, norm_first=False, **NN))


def test_refuses_non_mapping():
    with pytest.raises(TypeError, match="state_dict expected a dict"):
        from_nn_transformer([1, 2], norm_first=False, **NN)


# -- The Annotated Transformer --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_annotated_logits(dtype):
    model = annotated_model(dtype)
    config, weights = from_annotated(S.numpy_state_dict(model), **ANN)
    assert (config.norm_first, config.final_norm, config.norm_style) == (True, True, "annotated")
    assert (config.norm_eps, config.dtype, config.max_len, config.d_ff) == (1e-6, dtype, 32, 24)
    src, tgt = batch(config, seed=3)
    logits, log_probs = S.annotated_logits(model, src, tgt, config.pad_id)
    actual = R.forward(weights, config, src, tgt)
    # The Generator returns log_softmax(proj(x)); canonical logits are proj(x).
    shifted = actual - actual.max(-1, keepdims=True)
    actual_log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    if dtype == "float64":
        bound = FLOAT64
    else:
        measured = max(max_rel_diff(actual, logits), max_rel_diff(actual_log_probs, log_probs))
        bound = float32_bound_or_skip(measured)
    assert_close(actual, logits, bound, "logits")
    assert_close(actual_log_probs, log_probs, bound, "log_probs")


def test_annotated_tied_weights_become_equal_copies():
    """A common variant ties the generator and both embeddings to one table: the state dict holds
    it under three names; the import keeps three equal canonical copies, which compute the same."""
    model = annotated_model(src_vocab=13)
    model.src_embed[0].lut.weight = model.tgt_embed[0].lut.weight
    model.generator.proj.weight = model.tgt_embed[0].lut.weight
    config, weights = from_annotated(S.numpy_state_dict(model), **ANN)
    assert not config.share_embeddings and not config.tie_output
    np.testing.assert_array_equal(weights["src_embed.embeddings"], weights["tgt_embed.embeddings"])
    np.testing.assert_array_equal(weights["generator.kernel"], weights["tgt_embed.embeddings"].T)
    src, tgt = batch(config)
    expected = S.annotated_logits(model, src, tgt, config.pad_id)[0]
    assert_close(R.forward(weights, config, src, tgt), expected, FLOAT64, "logits")


def test_annotated_refusals():
    sd = S.numpy_state_dict(annotated_model())
    del sd["decoder.layers.1.sublayer.2.norm.b_2"]
    sd["src_embed.1.pe"] = other_tables(32, 16)["concatenated_sin_cos"][None]
    sd["decoder.layers.0.src_attn.linears.2.weight"] = np.zeros((16, 15))
    err = refused(from_annotated, sd, **{**ANN, "n_heads": 6})
    for text in ("missing keys: ['decoder.layers.1.sublayer.2.norm.b_2']",
                 "src_embed.1.pe: not the interleaved sinusoidal table",
                 "decoder.layers.0.src_attn.linears.2.weight: expected shape (16, 16), got (16, 15)",
                 "n_heads: expected a divisor of d_model=16, got 6"):
        assert text in str(err)


def test_annotated_shorter_table_sets_max_len():
    sd = S.numpy_state_dict(annotated_model())
    sd["tgt_embed.1.pe"] = sd["tgt_embed.1.pe"][:, :20]
    assert from_annotated(sd, **ANN)[0].max_len == 20


# -- the backends, where they exist ---------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch_impl", "tf_impl"])
@pytest.mark.parametrize("layout", ["nn_transformer", "annotated"])
def test_imported_weights_in_backend(backend, layout):
    module = pytest.importorskip(backend)
    if not hasattr(module, "Transformer"):
        pytest.skip(f"{backend}.Transformer does not exist yet")
    if layout == "nn_transformer":
        model = nn_model(norm_first=True)
        config, weights = from_nn_transformer(S.numpy_state_dict(model), norm_first=True, **NN)
        src, tgt = batch(config)
        expected = S.nn_transformer_logits(model, src, tgt, config.pad_id)
    else:
        model = annotated_model()
        config, weights = from_annotated(S.numpy_state_dict(model), **ANN)
        src, tgt = batch(config)
        expected = S.annotated_logits(model, src, tgt, config.pad_id)[0]
    net = module.Transformer(config)
    net.import_weights(weights)
    if backend == "torch_impl":
        net.eval()
        with torch.no_grad():
            actual = net(torch.as_tensor(src), torch.as_tensor(tgt)).numpy()
    else:
        actual = np.asarray(net(src, tgt, training=False))
    assert_close(actual, expected, FLOAT64, f"{backend} logits")


# -- near-miss layouts ------------------------------------------------------------------------------
def test_float64_positional_buffer_in_a_float32_model_is_accepted(nn_sd):
    """Both tutorials can build the buffer in float64 beside float32 weights: the buffer is only
    checked, never imported, so its dtype does not matter."""
    nn_sd["positional_encoding.pos_embedding"] = positional_encoding(32, 16)[:, None, :]
    config, weights = from_nn_transformer(nn_sd, norm_first=False, **NN)
    assert config.dtype == "float32" and all(w.dtype == np.float32 for w in weights.values())
    ann = S.numpy_state_dict(annotated_model(dtype="float32"))
    ann["src_embed.1.pe"] = positional_encoding(32, 16)[None]
    assert from_annotated(ann, **ANN)[0].dtype == "float32"
    nn_sd["generator.bias"] = nn_sd["generator.bias"].astype(np.float64)  # a weight: still refused
    assert "mixed dtypes" in str(refused(from_nn_transformer, nn_sd, norm_first=False, **NN))


def test_renamed_modules_are_named_and_mapped(nn_sd):
    """A tutorial whose TokenEmbedding subclasses nn.Embedding stores ``src_tok_emb.weight``."""
    model_sd = dict(nn_sd)
    for side in ("src", "tgt"):
        nn_sd[f"{side}_tok_emb.weight"] = nn_sd.pop(f"{side}_tok_emb.embedding.weight")
    err = refused(from_nn_transformer, nn_sd, norm_first=False, **NN)
    assert ("hint: unexpected keys that look like missing ones: 'src_tok_emb.weight' for "
            "'src_tok_emb.embedding.weight'") in str(err)
    assert "--rename src_tok_emb.=src_tok_emb.embedding." in str(err)
    rename = {"src_tok_emb.": "src_tok_emb.embedding.", "tgt_tok_emb.": "tgt_tok_emb.embedding."}
    config, weights = from_nn_transformer(nn_sd, norm_first=False, rename=rename, **NN)
    _, expected = from_nn_transformer(model_sd, norm_first=False, **NN)
    assert all(np.array_equal(weights[k], expected[k]) for k in expected)


def test_a_key_in_use_is_never_offered_as_a_renamed_one(nn_sd):
    """One table renamed, the other as the tutorial has it: before, the hint offered the target
    table, present and in use, for the missing source one ("--rename tgt_tok_emb.=src_tok_emb."),
    being the most alike by name."""
    nn_sd["src_tok_emb.weight"] = nn_sd.pop("src_tok_emb.embedding.weight")
    err = str(refused(from_nn_transformer, nn_sd, norm_first=False, **NN))
    assert ("hint: unexpected keys that look like missing ones: 'src_tok_emb.weight' for "
            "'src_tok_emb.embedding.weight'; if the modules were only renamed, map the prefixes: "
            "rename={'src_tok_emb.': 'src_tok_emb.embedding.'}") in err
    assert "tgt_tok_emb.embedding.weight' for" not in err


def test_rename_problems_are_reported(nn_sd):
    err = refused(from_nn_transformer, nn_sd, norm_first=False, rename={"nothing.": "x."}, **NN)
    assert "rename 'nothing.' -> 'x.': no key starts with 'nothing.'" in str(err)
    err = refused(from_nn_transformer, nn_sd, norm_first=False,
                  rename=[("src_tok_emb.", "tgt_tok_emb.")], **NN)
    assert "both become 'tgt_tok_emb.embedding.weight'" in str(err)
    with pytest.raises(TypeError, match="rename: expected"):
        from_nn_transformer(nn_sd, norm_first=False, rename=["a=b"], **NN)
    # a whole that is no mapping nor list of pairs: Python's "'int' object is not iterable", or a
    # str or lone pair named by its first character or string ("got the entry 'a'")
    for rename, got in ((5, "int 5"), ("a=b", "str 'a=b'"), (("a.", "b."), "tuple ('a.', 'b.')")):
        with pytest.raises(TypeError, match=rf"^rename: expected .* of str key prefixes, got {re.escape(got)}$"):
            from_nn_transformer(nn_sd, norm_first=False, rename=rename, **NN)
    # the second mapping of one OLD was dropped silently (the first won)
    with pytest.raises(ValueError, match="rename: expected each OLD prefix once, got 'src_tok_emb.' 2 times"):
        from_nn_transformer(nn_sd, norm_first=False, rename=[("src_tok_emb.", "a."), ("src_tok_emb.", "b.")], **NN)


def test_annotated_rename_of_a_wrapped_model():
    """A model saved inside a wrapper (``model.`` before every key) maps with an empty NEW."""
    sd = {f"model.{k}": v for k, v in S.numpy_state_dict(annotated_model()).items()}
    assert "'model.': ''" in str(refused(from_annotated, sd, **ANN))
    assert from_annotated(sd, rename={"model.": ""}, **ANN)[0].d_model == 16
