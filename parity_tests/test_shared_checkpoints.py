"""`shared.checkpoints`, NumPy only: which format a path is (suffix, directory, file), refusing
what no format reads, `detect` for conversions, load-into's config check, and `read_stored`, the
per-tensor checks both native readers use."""
import numpy as np
import pytest

from shared import TransformerConfig
from shared import checkpoints as C
from shared.checkpoints import NEUTRAL, CheckpointFormat, Slot, Stored, read_stored
from shared.weights import WeightsError, random_weights, save_checkpoint, weight_schema

TINY = TransformerConfig.preset("tiny")


def fake(name, suffix, calls):
    """A native format that records its calls and reads back what it was given."""
    def read(path, config=None, allow_nonfinite=False):
        calls.append(("read", name, str(path), config, allow_nonfinite))
        return TINY, random_weights(TINY, 0)

    def write(path, config, weights):
        calls.append(("write", name, str(path)))
        return path
    return CheckpointFormat(name, (suffix,), read, write, f"a {suffix} file")


@pytest.fixture
def formats():
    calls = []
    return (NEUTRAL, fake("pt", ".pt", calls), fake("h5", ".weights.h5", calls)), calls


def test_dispatch_by_suffix_then_directory(tmp_path, formats):
    fmts, calls = formats
    assert C.format_of(tmp_path / "m.pt", fmts).name == "pt"
    assert C.format_of(tmp_path / "m.weights.h5", fmts).name == "h5"
    assert C.format_of(tmp_path / "m.h5", fmts) is NEUTRAL  # only the whole suffix selects
    assert C.format_of(tmp_path, fmts) is NEUTRAL  # an existing directory
    assert C.format_of(tmp_path / "new", fmts) is NEUTRAL  # a path not written yet
    (tmp_path / "d.pt").mkdir()
    assert C.format_of(tmp_path / "d.pt", fmts).name == "pt"  # the suffix wins; its reader refuses
    C.read_checkpoint(tmp_path / "m.pt", fmts, TINY, True)
    C.write_checkpoint(tmp_path / "x.weights.h5", TINY, {}, fmts)
    assert calls == [("read", "pt", str(tmp_path / "m.pt"), TINY, True),
                     ("write", "h5", str(tmp_path / "x.weights.h5"))]


def test_an_unknown_file_is_refused_with_the_path_and_the_formats(tmp_path, formats):
    fmts, calls = formats
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError) as info:
        C.read_checkpoint(tmp_path / "notes.txt", fmts[:2], owner="torch_impl")
    assert str(info.value).startswith(f"{str(tmp_path / 'notes.txt')!r}: torch_impl reads and writes "
                                      "a neutral checkpoint directory or a .pt file; this is neither")
    with pytest.raises(ValueError, match="a neutral checkpoint directory or a .pt file or a "
                                         r".weights.h5 file; this is none of them"):
        C.write_checkpoint(tmp_path / "notes.txt", TINY, {}, fmts)
    assert (tmp_path / "notes.txt").read_text() == "hello" and calls == []
    # Without the neutral format, no path but a suffixed one is anything.
    with pytest.raises(ValueError, match="reads and writes a .pt file"):
        C.format_of(tmp_path / "new", fmts[1:2])


def test_neutral_format_reads_and_writes_the_directory(tmp_path):
    weights = random_weights(TINY, 1)
    assert C.write_checkpoint(tmp_path / "c", TINY, weights, (NEUTRAL,)) == tmp_path / "c"
    config, read = C.read_checkpoint(tmp_path / "c", (NEUTRAL,))
    assert config == TINY and all(read[k].tobytes() == v.tobytes() for k, v in weights.items())
    with pytest.raises(ValueError, match="'?: a neutral checkpoint holds its config; do not pass one"):
        C.read_checkpoint(tmp_path / "c", (NEUTRAL,), config=TINY)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        C.read_checkpoint(tmp_path / "none", (NEUTRAL,))


def test_read_for_checks_the_config(tmp_path, formats):
    fmts, calls = formats
    save_checkpoint(tmp_path / "c", TINY, random_weights(TINY, 1))
    other = TINY.replace(dropout=0.3)
    with pytest.raises(ValueError, match=r"c'?: the config given \(the model's, or --config\) differs from "
                                         r"the one in the file in dropout: 0.3 vs 0.1 \(given vs the file's\)"):
        C.read_for(tmp_path / "c", other, fmts)
    assert C.read_for(tmp_path / "c", TINY, fmts).keys() == weight_schema(TINY).keys()
    C.read_for(tmp_path / "m.pt", TINY, fmts)  # a native format gets the config (bare files)
    assert calls[-1][3] == TINY


# -- read_stored ----------------------------------------------------------------------------------
def stored_of(weights, transpose=()):
    return {n: Stored(v.T.shape if n in transpose else v.shape, v.dtype.name,
                      (lambda v=v, t=n in transpose: v.T if t else v)) for n, v in weights.items()}


def layout_of(config, transpose=(), dtype=None):
    return {n: Slot(n, s[::-1] if n in transpose else s, dtype or config.dtype, n in transpose)
            for n, s in weight_schema(config).items()}


def test_read_stored_returns_owned_canonical_arrays_in_schema_order():
    weights = random_weights(TINY, 2)
    kernels = ("encoder.layers.0.ffn.inner.kernel", "generator.kernel")
    out = read_stored(TINY, layout_of(TINY, kernels), stored_of(weights, kernels), "f")
    assert list(out) == list(weight_schema(TINY))
    for name, value in weights.items():
        assert out[name].tobytes() == value.tobytes() and out[name].flags.c_contiguous, name
        assert not np.shares_memory(out[name], value)


def test_read_stored_reports_every_problem_at_once_naming_the_source():
    weights = random_weights(TINY, 2)
    stored = stored_of(weights)
    del stored["generator.bias"]
    stored["extra"] = Stored((1,), "float32", lambda: np.zeros(1, np.float32))
    stored["encoder.final_norm.gamma"] = Stored((3,), "float32", lambda: np.zeros(3, np.float32))
    stored["encoder.final_norm.beta"] = Stored((16,), "float16", lambda: np.zeros(16, np.float16))
    bad = weights["src_embed.embeddings"].copy()
    bad[0, 0] = np.nan
    stored["src_embed.embeddings"] = Stored(bad.shape, "float32", lambda: bad)
    stored["decoder.final_norm.beta"] = "expected a tensor, got str"
    with pytest.raises(WeightsError) as info:
        read_stored(TINY, layout_of(TINY), stored, "the file", what="datasets",
                    label=lambda k: f"<{k}>", problems=["first"])
    assert info.value.problems == [
        "first", "missing datasets: ['<generator.bias>']", "unexpected datasets: ['extra']",
        "<src_embed.embeddings>: contains NaN or Inf",
        "<encoder.final_norm.gamma>: expected shape (16,) (from the config), got (3,)",
        "<encoder.final_norm.beta>: expected dtype float32 (the config's), got float16",
        "decoder.final_norm.beta: expected a tensor, got str"]
    assert str(info.value).startswith("the file: 7 problem(s)")
    # NaN/Inf pass when allowed
    stored = stored_of(weights)
    stored["src_embed.embeddings"] = Stored(bad.shape, "float32", lambda: bad)
    out = read_stored(TINY, layout_of(TINY), stored, "f", allow_nonfinite=True)
    assert np.isnan(out["src_embed.embeddings"][0, 0])


def test_read_stored_tied_copies_must_agree_and_non_weights_are_not_read():
    weights = random_weights(TINY, 2)
    layout = layout_of(TINY)
    layout["copy"] = Slot("src_embed.embeddings", weights["src_embed.embeddings"].shape, "float32")
    layout["seed"] = Slot(None, (2,), "uint32")  # state that is no weight: present, never read
    stored = stored_of(weights)
    stored["seed"] = Stored((2,), "uint32", lambda: pytest.fail("a non-weight was read"))
    stored["copy"] = stored["src_embed.embeddings"]
    read_stored(TINY, layout, stored, "f")  # equal copies are one weight
    other = weights["src_embed.embeddings"] + 1
    stored["copy"] = Stored(other.shape, "float32", lambda: other)
    with pytest.raises(WeightsError, match="copy: expected the same values as src_embed.embeddings "
                                           r"\(one tied weight\), got different ones"):
        read_stored(TINY, layout, stored, "f")
