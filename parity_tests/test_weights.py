import json
import os

import numpy as np
import pytest

from shared import TransformerConfig
from shared import reference as R
from shared import weights as W
from shared.batches import src_tgt
from shared.weights import (WeightsError, check_weights, init_weights, load_checkpoint,
                            parameter_count, random_weights, save_checkpoint, weight_schema)

TINY = TransformerConfig.preset("tiny")


def test_base_parameter_count_matches_the_paper_formula():
    c = TransformerConfig.preset("base")
    d, f, v = c.d_model, c.d_ff, c.src_vocab
    attn, norm, ffn = 4 * (d * d + d), 2 * d, d * f + f + f * d + d
    expected = v * d + 6 * (attn + ffn + 2 * norm) + 6 * (2 * attn + ffn + 3 * norm) + v
    assert parameter_count(c) == expected
    assert 60e6 < expected < 66e6  # the paper reports 65M for base (Table 3)


@pytest.mark.parametrize("share, tie, absent", [
    (False, False, []),
    (True, False, ["tgt_embed.embeddings"]),
    (False, True, ["generator.kernel"]),
    (True, True, ["tgt_embed.embeddings", "generator.kernel"]),
])
def test_tied_weights_are_stored_once(share, tie, absent):
    c = TINY.replace(tgt_vocab=TINY.src_vocab, share_embeddings=share, tie_output=tie)
    schema = weight_schema(c)
    for name in absent:
        assert name not in schema
    assert "generator.bias" in schema and "src_embed.embeddings" in schema


def test_schema_names_and_kernel_layout():
    schema = weight_schema(TINY)
    assert schema["encoder.layers.0.self_attn.query.kernel"] == (16, 16)
    assert schema["decoder.layers.1.ffn.inner.kernel"] == (16, 32)  # (in, out)
    assert schema["decoder.layers.1.ffn.outer.kernel"] == (32, 16)
    assert schema["generator.kernel"] == (16, 17)
    assert "encoder.final_norm.gamma" in schema  # pre-norm has final norms
    assert "encoder.final_norm.gamma" not in weight_schema(TINY.replace(norm_first=False))


def test_init_is_deterministic_xavier_with_identity_norms():
    a, b, c = init_weights(TINY, 1), init_weights(TINY, 1), init_weights(TINY, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["src_embed.embeddings"], c["src_embed.embeddings"])
    k = a["encoder.layers.0.ffn.inner.kernel"]
    assert k.dtype == np.float32 and np.abs(k).max() <= np.sqrt(6 / (16 + 32))
    assert (a["encoder.layers.0.ffn_norm.gamma"] == 1).all() and (a["generator.bias"] == 0).all()
    assert init_weights(TINY.replace(dtype="float64"))["generator.bias"].dtype == np.float64


def test_random_weights_leave_no_tensor_constant():
    w = random_weights(TINY, 0)
    check_weights(TINY, w)
    for name, value in w.items():
        assert np.unique(value).size == value.size, name


def test_check_weights_reports_every_problem_at_once():
    w = random_weights(TINY, 0)
    del w["generator.bias"]
    w["bogus"] = np.zeros(3, np.float32)
    w["encoder.layers.0.self_attn.query.kernel"] = np.zeros((16, 8), np.float32)
    w["encoder.layers.0.ffn.inner.bias"] = w["encoder.layers.0.ffn.inner.bias"].astype(np.float64)
    w["decoder.layers.0.ffn.inner.bias"] = np.full(32, np.nan, np.float32)
    with pytest.raises(WeightsError) as err:
        check_weights(TINY, w)
    text = str(err.value)
    assert "5 problem(s)" in text
    for needle in ("missing: ['generator.bias']", "unexpected: ['bogus']",
                   "query.kernel: expected shape (16, 16), got (16, 8)",
                   "inner.bias: expected dtype float32, got float64",
                   "decoder.layers.0.ffn.inner.bias: contains NaN or Inf"):
        assert needle in text
    check_weights(TINY, {**random_weights(TINY), "generator.bias": np.full(17, np.inf, np.float32)},
                  allow_nonfinite=True)


def test_one_rule_for_shape_and_dtype_and_where_nonfinite_is_looked_for():
    """`tensor_problems` is the rule of check_weights and of both native readers; a tensor of the
    wrong dtype is not looked into for NaN/Inf, a mis-shaped one still is."""
    assert W.tensor_problems("k", (2, 3), "float32", (2, 3), "float32") == []
    assert W.tensor_problems("k", (2, 3), "float32", (3, 2), "float64", (" (from the config)", " (x)")) == [
        "k: expected shape (2, 3) (from the config), got (3, 2)", "k: expected dtype float32 (x), got float64"]
    w = random_weights(TINY, 0)
    w["generator.bias"] = np.full(5, np.nan, np.float32)  # mis-shaped and NaN: both reported
    embed = weight_schema(TINY)["src_embed.embeddings"]
    w["src_embed.embeddings"] = np.full(embed, np.nan, np.float64)  # wrong dtype: that alone
    with pytest.raises(WeightsError) as err:
        check_weights(TINY, w)
    assert err.value.problems == ["src_embed.embeddings: expected dtype float32, got float64",
                                  f"generator.bias: expected shape ({TINY.tgt_vocab},), got (5,)",
                                  "generator.bias: contains NaN or Inf"]


def test_big_endian_weights_are_their_values_in_the_native_order(tmp_path):
    """A big-endian array (``>f4``: NumPy's reading of a file written on such a machine) holds the
    config's dtype: check_weights returns it native, each value kept bit for bit, and what reads
    through it (a checkpoint, the reference) takes it; a cast's width is still refused."""
    w = random_weights(TINY, 2)
    swapped = {name: value.astype(value.dtype.newbyteorder(">")) for name, value in w.items()}
    checked = check_weights(TINY, swapped)
    for name, value in w.items():
        assert checked[name].dtype == value.dtype and checked[name].dtype.isnative, name
        assert checked[name].tobytes() == value.tobytes(), name
    _, loaded = load_checkpoint(save_checkpoint(tmp_path / "ckpt", TINY, swapped))
    assert all(loaded[name].tobytes() == value.tobytes() for name, value in w.items())
    src, tgt = src_tgt(TINY, batch=2, src_len=5, tgt_len=4, seed=0)
    assert np.array_equal(R.forward(swapped, TINY, src, tgt), R.forward(w, TINY, src, tgt))
    w["generator.bias"] = w["generator.bias"].astype(">f8")
    with pytest.raises(WeightsError, match=r"generator.bias: expected dtype float32, got float64$"):
        check_weights(TINY, w)


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    for config in (TINY, TINY.replace(dtype="float64", share_embeddings=True, tgt_vocab=13)):
        w = random_weights(config, 3)
        path = save_checkpoint(tmp_path / f"ckpt-{config.dtype}", config, w)
        assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
        assert json.loads((path / "config.json").read_text())["format_version"] == W.FORMAT_VERSION
        config2, w2 = load_checkpoint(path)
        assert config2 == config and set(w2) == set(w)
        for name in w:
            assert w2[name].dtype == w[name].dtype and w2[name].tobytes() == w[name].tobytes()


def test_save_replaces_a_checkpoint_but_refuses_other_directories(tmp_path):
    save_checkpoint(tmp_path / "c", TINY, random_weights(TINY, 0))
    save_checkpoint(tmp_path / "c", TINY, random_weights(TINY, 1))
    _, w = load_checkpoint(tmp_path / "c")
    assert np.array_equal(w["generator.bias"], random_weights(TINY, 1)["generator.bias"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a checkpoint; refusing"):
        save_checkpoint(tmp_path / "other", TINY, random_weights(TINY, 0))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["c", "other"]  # no temporary directories left


def test_crash_while_writing_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    import safetensors.numpy

    save_checkpoint(tmp_path / "c", TINY, random_weights(TINY, 0))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "c", TINY, random_weights(TINY, 1))
    _, w = load_checkpoint(tmp_path / "c")
    assert np.array_equal(w["generator.bias"], random_weights(TINY, 0)["generator.bias"])
    assert sorted(os.listdir(tmp_path)) == ["c"]


def test_save_rejects_bad_weights_before_writing(tmp_path):
    w = random_weights(TINY)
    del w["generator.bias"]
    with pytest.raises(WeightsError, match="missing"):
        save_checkpoint(tmp_path / "c", TINY, w)
    assert not (tmp_path / "c").exists()


# -- bad files ------------------------------------------------------------------------------------
@pytest.fixture
def ckpt(tmp_path):
    return save_checkpoint(tmp_path / "ckpt", TINY, random_weights(TINY, 0))


def test_load_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nope")


def test_load_a_file_not_a_directory(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"123")
    with pytest.raises(ValueError, match="is not a checkpoint directory"):
        load_checkpoint(tmp_path / "f.bin")


def test_load_missing_weights_file(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="missing .*model.safetensors"):
        load_checkpoint(ckpt)


def test_load_truncated_weights(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors.*not a readable safetensors file"):
        load_checkpoint(ckpt)


def test_load_another_format(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"PK\x03\x04 this is a zip, not safetensors" * 10)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("text, needle", [
    ("{", "not valid JSON"),
    ('{"config": {}}', "expected keys 'format_version' and 'config'"),
    ('{"format_version": 99, "config": {}}', "unknown format_version 99"),
    ('{"format_version": 1, "config": {"src_vocab": 13, "tgt_vocab": 17, "d_model": 15}}',
     "invalid config: TransformerConfig.d_model"),
])
def test_load_bad_config(ckpt, text, needle):
    (ckpt / "config.json").write_text(text)
    with pytest.raises(ValueError, match=needle):
        load_checkpoint(ckpt)


def test_load_config_contradicting_weights(ckpt):
    header = json.loads((ckpt / "config.json").read_text())
    header["config"]["d_ff"] = 64
    (ckpt / "config.json").write_text(json.dumps(header))
    with pytest.raises(WeightsError, match=r"ffn.inner.kernel: expected shape \(16, 64\), got \(16, 32\)"):
        load_checkpoint(ckpt)


def test_load_wrong_dtype_and_nonfinite(tmp_path):
    from safetensors.numpy import save_file

    w = random_weights(TINY)
    w["generator.bias"] = w["generator.bias"].astype(np.float16)
    w["src_embed.embeddings"][0, 0] = np.inf
    path = save_checkpoint(tmp_path / "c", TINY, random_weights(TINY))
    save_file(w, str(path / "model.safetensors"))
    with pytest.raises(WeightsError) as err:
        load_checkpoint(path)
    assert "generator.bias: expected dtype float32, got float16" in str(err.value)
    assert "src_embed.embeddings: contains NaN or Inf" in str(err.value)
    w["generator.bias"] = w["generator.bias"].astype(np.float32)
    save_file(w, str(path / "model.safetensors"))
    _, loaded = load_checkpoint(path, allow_nonfinite=True)
    assert np.isinf(loaded["src_embed.embeddings"][0, 0])


def test_checkpoints_get_ordinary_permissions(tmp_path):
    """The temporary directory/file of an atomic write is private; the result must not be."""
    mask = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "c", TINY, random_weights(TINY))
        W.write_atomically(tmp_path / "f.bin", lambda tmp: open(tmp, "wb").write(b"x"))
    finally:
        os.umask(mask)
    assert (path.stat().st_mode & 0o777) == 0o755
    assert ((path / "model.safetensors").stat().st_mode & 0o777) == 0o644
    assert ((path / "config.json").stat().st_mode & 0o777) == 0o644
    assert ((tmp_path / "f.bin").stat().st_mode & 0o777) == 0o644
    assert (tmp_path / "f.bin").read_bytes() == b"x"
