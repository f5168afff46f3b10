"""Checkpoint files in both backends, one contract each, parametrized by backend: the native file
(torch ``.pt``, Keras ``.weights.h5``) and the neutral directory round trip byte for byte, every
kind of bad file is refused with the file named and nothing loaded partially, every problem is
reported at once, NaN/Inf load only when allowed, nothing is half-written, another config is
refused, and the model-level functions have the same names and signatures in both backends.

What one format alone has (the ``.pt`` pickle refusals and bare state dicts; Keras' own weights
files) is in test_torch_weights.py and test_tf_weights.py; the files across the two frameworks in
test_porting.py; the dispatcher itself in test_shared_checkpoints.py.
"""
import inspect
import json
import os

import numpy as np
import pytest

from parity_tests.checkpoint_backends import BACKENDS, TIED, TINY, assert_same_bytes, side, write_native
from shared.weights import WeightsError, load_checkpoint, random_weights, save_checkpoint, write_checkpoint_files

pytestmark = [pytest.mark.torch, pytest.mark.tf]
torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow")

MODEL_LEVEL = ("load_checkpoint", "save_checkpoint", "load_into", "read_checkpoint", "write_checkpoint")


@pytest.fixture(params=BACKENDS, scope="module")
def backend(request):
    return side(request.param)


# -- the same functions in both backends ----------------------------------------------------------
def test_model_level_functions_are_the_same_in_both_backends():
    torch_side, tf_side = side("torch"), side("tf")
    for name in MODEL_LEVEL:
        a, b = getattr(torch_side.checkpoints, name), getattr(tf_side.checkpoints, name)
        assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters), name
        assert [p.default for p in inspect.signature(a).parameters.values()] == \
            [p.default for p in inspect.signature(b).parameters.values()], name
    for s in (torch_side, tf_side):
        assert s.impl.load_checkpoint is s.checkpoints.load_checkpoint
        assert s.impl.save_checkpoint is s.checkpoints.save_checkpoint
        # file handling sits above the model: the model class knows nothing of files
        assert not hasattr(s.Transformer, "from_checkpoint")
        assert not hasattr(s.Transformer, "save_checkpoint")


# -- round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [TINY, TIED], ids=["tiny_float32", "tied_float64"])
@pytest.mark.parametrize("kind", ["native", "neutral"])
def test_round_trip_through_a_file_is_byte_identical(tmp_path, backend, config, kind):
    weights = random_weights(config, 5)
    weights["generator.bias"][0] = -0.0  # the sign of zero survives too
    path = tmp_path / ("m" + backend.suffix if kind == "native" else "ckpt")
    assert backend.checkpoints.save_checkpoint(backend.model(config, weights), path) == path
    loaded = backend.checkpoints.load_checkpoint(path)
    assert isinstance(loaded, backend.Transformer) and loaded.config == config
    assert_same_bytes(loaded.export_weights(), weights)
    stored, read = backend.checkpoints.read_checkpoint(path)
    assert stored == config
    assert_same_bytes(read, weights)
    assert np.signbit(read["generator.bias"][0])
    # write_checkpoint (canonical weights, no model) stores the same (HDF5 files are not
    # byte-deterministic: compared by what they hold)
    again = tmp_path / ("again" + backend.suffix if kind == "native" else "again")
    assert backend.checkpoints.write_checkpoint(again, config, weights) == again
    assert backend.checkpoints.read_checkpoint(again)[0] == config
    assert_same_bytes(backend.checkpoints.read_checkpoint(again)[1], weights)
    if kind == "neutral":
        for name in ("config.json", "model.safetensors"):
            assert (again / name).read_bytes() == (path / name).read_bytes()
    # load_into an existing model of the same config
    model = backend.model(config, random_weights(config, 1))
    backend.checkpoints.load_into(model, path)
    assert_same_bytes(model.export_weights(), weights)


# -- bad files ------------------------------------------------------------------------------------
def write_neutral(tmp_path, config=TINY, weights=None):
    weights = random_weights(config, 0) if weights is None else weights
    return save_checkpoint(tmp_path / "ckpt", config, weights)


def neutral_cases():
    """name -> make(tmp_path) -> (path, exception type, message fragment)."""
    def missing(tmp):
        return tmp / "nowhere", FileNotFoundError, "no checkpoint at"

    def truncated(tmp):
        path = write_neutral(tmp)
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
        return path, ValueError, "model.safetensors'?: not a readable safetensors file"

    def corrupted(tmp):
        path = write_neutral(tmp)
        data = bytearray((path / "model.safetensors").read_bytes())
        data[8:40] = b"\xff" * 32  # inside the JSON header
        (path / "model.safetensors").write_bytes(bytes(data))
        return path, ValueError, "model.safetensors'?: not a readable safetensors file"

    def other_format(tmp):
        path = write_neutral(tmp)
        torch.save({"a": torch.zeros(2)}, path / "model.safetensors")  # a torch zip under the name
        return path, ValueError, "model.safetensors'?: not a readable safetensors file"

    def contradicting_config(tmp):
        path = write_neutral(tmp)
        header = json.loads((path / "config.json").read_text())
        header["config"]["d_ff"] = 24
        (path / "config.json").write_text(json.dumps(header))
        return path, WeightsError, r"ffn.inner.kernel: expected shape \(16, 24\), got \(16, 32\)"

    def version(tmp):
        path = write_neutral(tmp)
        header = json.loads((path / "config.json").read_text())
        header["format_version"] = 2
        (path / "config.json").write_text(json.dumps(header))
        return path, ValueError, "config.json'?: unknown format_version 2"

    def wrong_dtype(tmp):
        from safetensors.numpy import save_file
        path = write_neutral(tmp)
        weights = {k: v.astype(np.float64) for k, v in random_weights(TINY, 0).items()}
        save_file(weights, str(path / "model.safetensors"))
        return path, WeightsError, "generator.bias: expected dtype float32, got float64"

    def nonfinite(tmp):
        from safetensors.numpy import save_file
        path = write_neutral(tmp)
        weights = random_weights(TINY, 0)
        weights["decoder.layers.1.ffn.outer.bias"][2] = np.nan
        weights["src_embed.embeddings"][0, 0] = -np.inf
        save_file(weights, str(path / "model.safetensors"))
        return path, WeightsError, "src_embed.embeddings: contains NaN or Inf"

    return {f.__name__: f for f in (missing, truncated, corrupted, other_format, contradicting_config,
                                    version, wrong_dtype, nonfinite)}


def native_cases(name):
    s = side(name)
    file = f"m{s.suffix}"

    def missing(tmp):
        return tmp / file, FileNotFoundError, "no such file"

    def truncated(tmp):
        path = write_native(tmp, name)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path, ValueError, s.not_native

    def text(tmp):
        (tmp / file).write_text("just some text\n")
        return tmp / file, ValueError, s.not_native

    def other_format(tmp):  # the other backend's native file under this backend's name
        os.replace(write_native(tmp, s.other), tmp / file)
        return tmp / file, ValueError, s.not_native

    def contradicting_config(tmp):
        path = write_native(tmp, name)
        s.set_config(path, TINY.replace(d_ff=24).to_json())
        return path, WeightsError, s.contradicting

    def version(tmp):
        path = write_native(tmp, name)
        s.set_version(path, 2)
        return path, ValueError, "unknown format_version 2, this version reads 1"

    def wrong_dtype(tmp):
        path = write_native(tmp, name)
        s.to_float64(path, "generator.bias")
        return path, WeightsError, r"generator.bias\)?: expected dtype float32 \(the config's\), got float64"

    def nonfinite(tmp):
        path = write_native(tmp, name)
        s.poison(path, "decoder.final_norm.beta")
        return path, WeightsError, r"decoder.final_norm.beta\)?: contains NaN or Inf"

    return {f.__name__: f for f in (missing, truncated, text, other_format, contradicting_config,
                                    version, wrong_dtype, nonfinite)}


NEUTRAL_CASES = ["missing", "truncated", "corrupted", "other_format", "contradicting_config", "version",
                 "wrong_dtype", "nonfinite"]
NATIVE_CASES = ["missing", "truncated", "text", "other_format", "contradicting_config", "version",
                "wrong_dtype", "nonfinite"]  # the other backend's file loads: test_formats.py
CASES = [("neutral", n) for n in NEUTRAL_CASES] + [("native", n) for n in NATIVE_CASES]


@pytest.fixture(scope="module")
def loaded_models():
    """One model per backend, loaded before each bad file is tried on it (never changed by them)."""
    return {b: side(b).model(TINY, random_weights(TINY, 9)) for b in BACKENDS}


@pytest.mark.parametrize("kind, case", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_bad_file_is_refused_by_name_and_changes_nothing(tmp_path, loaded_models, backend, kind, case):
    make = (neutral_cases() if kind == "neutral" else native_cases(backend.name))[case]
    path, error, needle = make(tmp_path)
    with pytest.raises(error, match=needle) as info:
        backend.checkpoints.load_checkpoint(path)
    assert str(path) in str(info.value), f"the message does not name {path}: {info.value}"
    model = loaded_models[backend.name]
    before = model.export_weights()
    # Loading into a model: the same refusal (or, where the file's config is what is wrong, the
    # mismatch with the model's config), and the model keeps its weights.
    with pytest.raises(FileNotFoundError if error is FileNotFoundError else ValueError) as info:
        backend.checkpoints.load_into(model, path)
    assert str(path) in str(info.value)
    assert_same_bytes(model.export_weights(), before)


def test_every_problem_is_reported_at_once(tmp_path, backend):
    path = write_native(tmp_path, backend.name)
    texts = backend.damage_everything(path)
    with pytest.raises(WeightsError) as info:
        backend.checkpoints.load_checkpoint(path)
    assert len(info.value.problems) == 5, info.value.problems
    assert str(info.value).startswith(f"{path}: 5 problem(s)")
    for text in texts:
        assert text in str(info.value)


@pytest.mark.parametrize("kind", ["neutral", "native"])
def test_nonfinite_weights_load_only_when_allowed(tmp_path, backend, kind):
    make = neutral_cases()["nonfinite"] if kind == "neutral" else native_cases(backend.name)["nonfinite"]
    path, _, _ = make(tmp_path)
    model = backend.checkpoints.load_checkpoint(path, allow_nonfinite=True)
    assert not np.isfinite(model.export_weights()["decoder.final_norm.beta" if kind == "native"
                                                  else "src_embed.embeddings"]).all()
    _, weights = backend.checkpoints.read_checkpoint(path, allow_nonfinite=True)
    assert not np.isfinite(weights["decoder.final_norm.beta" if kind == "native"
                                    else "src_embed.embeddings"]).all()
    target = backend.model(TINY, random_weights(TINY, 1))
    backend.checkpoints.load_into(target, path, allow_nonfinite=True)
    assert_same_bytes(target.export_weights(), weights)
    # Saving always refuses them, and writes nothing.
    with pytest.raises(WeightsError, match="contains NaN or Inf"):
        backend.checkpoints.save_checkpoint(model, tmp_path / f"again{backend.suffix}")
    with pytest.raises(WeightsError, match="contains NaN or Inf"):
        backend.checkpoints.save_checkpoint(model, tmp_path / "again_dir")
    assert not [p for p in os.listdir(tmp_path) if p.startswith(("again", ".again"))]


# -- no file half-written -------------------------------------------------------------------------
def test_crash_while_saving_keeps_the_old_file(tmp_path, monkeypatch, backend):
    path = write_native(tmp_path, backend.name)
    old = path.read_bytes()
    model = backend.model(TINY, random_weights(TINY, 1))
    backend.break_writer(monkeypatch)
    for target in (path, tmp_path / f"new{backend.suffix}"):
        with pytest.raises(OSError, match="disk full"):
            backend.checkpoints.save_checkpoint(model, target)
        assert path.read_bytes() == old and os.listdir(tmp_path) == [path.name]


def test_save_refuses_to_replace_a_directory_or_a_path_no_format_claims(tmp_path, backend):
    model = backend.model(TINY, random_weights(TINY, 1))
    (tmp_path / f"d{backend.suffix}").mkdir()
    with pytest.raises(FileExistsError, match="is a directory"):
        backend.checkpoints.save_checkpoint(model, tmp_path / f"d{backend.suffix}")
    for name in ("model.onnx", "model.safetensors"):  # no format's path: never a directory so named
        with pytest.raises(ValueError, match="cannot tell the destination format.*pass format= with one of"):
            backend.checkpoints.save_checkpoint(model, tmp_path / name)
        assert not (tmp_path / name).exists()
    readme = tmp_path / "README.txt"
    readme.write_text("keep me")
    with pytest.raises(ValueError, match="cannot tell the destination format"):
        backend.checkpoints.save_checkpoint(model, readme)
    assert readme.read_text() == "keep me"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a checkpoint; refusing"):
        backend.checkpoints.save_checkpoint(model, tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_save_writes_the_format_its_path_or_name_says(tmp_path, backend):
    """``save_checkpoint`` writes what the path says as `twins convert` reads a destination
    (`shared.formats.destination`): the other backend's native file too (through that backend,
    here installed), and any writable format by ``format=`` with its options; each reads back
    (where the format is read) to the same bytes."""
    model = backend.model(TINY, random_weights(TINY, 1))
    want = model.export_weights()
    other = write_native(tmp_path, backend.other)  # replaced, as this backend's own file would be
    assert backend.checkpoints.save_checkpoint(model, other) == other
    assert_same_bytes(side(backend.other).checkpoints.load_checkpoint(other).export_weights(), want)
    assert_same_bytes(backend.checkpoints.load_checkpoint(other).export_weights(), want)
    named = tmp_path / "run.v2"  # a suffix no format claims: a neutral directory by name
    backend.checkpoints.save_checkpoint(model, named, format="neutral")
    assert (named / "config.json").is_file()
    assert_same_bytes(backend.checkpoints.load_checkpoint(named).export_weights(), want)
    with pytest.raises(ValueError, match="max_new: only for --to saved-model, not --to neutral"):
        backend.checkpoints.save_checkpoint(model, tmp_path / "x", format="neutral", max_new=3)
    with pytest.raises(ValueError, match=r"format: expected one of the writable formats .*got 'fsmt' \(fsmt is read only\)"):
        backend.checkpoints.save_checkpoint(model, tmp_path / "y", format="fsmt")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("written", ["torch", "tf", "neutral"])
def test_a_named_format_is_read_whatever_the_path_says(tmp_path, backend, written):
    """``format=`` decides over the path, in saving and in loading, whichever backend does either.
    Before, a backend's loader took the path's word for its own and the neutral format (a ``.pt``
    file saved as ``m.weights.h5`` loaded in tf_impl, not in torch_impl), and tf_impl refused to
    save its own format under a name without ``.weights.h5``."""
    model = backend.model(TINY, random_weights(TINY, 1))
    path = tmp_path / {"torch": "m.weights.h5", "tf": "m.pt", "neutral": "m.pt"}[written]
    backend.checkpoints.save_checkpoint(model, path, format=written)
    for reader in (side("torch"), side("tf")):
        stored, weights = reader.checkpoints.read_checkpoint(path, format=written)
        assert stored == TINY
        assert_same_bytes(weights, model.export_weights())
        assert_same_bytes(reader.checkpoints.load_checkpoint(path, format=written).export_weights(), weights)


def test_write_native_names_a_config_that_is_not_one(tmp_path, backend):
    """torch_impl's wrote ``config.to_json()`` first: ``AttributeError: 'NoneType' object has no
    attribute 'to_json'``, where tf_impl's named the argument."""
    for config, got in ((None, "NoneType"), (TINY.to_dict(), "dict")):
        with pytest.raises(TypeError, match=f"^config: expected a TransformerConfig, got {got}$"):
            backend.checkpoints.write_native(tmp_path / "x", config, random_weights(TINY, 1))
    assert not (tmp_path / "x").exists()


def test_a_format_that_is_no_name_is_refused_in_loading_as_in_saving(tmp_path, backend):
    """``format=""`` and ``format=0`` loaded the file as if no format were named (a truth test);
    ``save_checkpoint`` refused them. Now both sides say the same, by name."""
    path = write_neutral(tmp_path)
    for load in (backend.checkpoints.load_checkpoint, backend.checkpoints.read_checkpoint):
        with pytest.raises(ValueError, match=r"format: expected one of the readable formats .*, got ''"):
            load(path, format="")
        with pytest.raises(TypeError, match=r"format: expected a format name \(one of neutral, .*\), got int"):
            load(path, format=0)
    model = backend.model(TINY, random_weights(TINY, 1))
    with pytest.raises(ValueError, match=r"format: expected one of the writable formats .*, got ''"):
        backend.checkpoints.save_checkpoint(model, tmp_path / "new", format="")


@pytest.mark.parametrize("kind", ["native", "neutral"])
def test_load_into_refuses_another_config(tmp_path, backend, kind):
    path = write_native(tmp_path, backend.name) if kind == "native" else write_neutral(tmp_path)
    model = backend.model(TINY.replace(dropout=0.3), random_weights(TINY, 1))
    before = model.export_weights()
    needle = "differs from the one in the file in dropout: 0.3 vs 0.1"  # one message for both kinds
    with pytest.raises(ValueError, match=needle) as info:
        backend.checkpoints.load_into(model, path)
    assert str(path) in str(info.value)
    assert_same_bytes(model.export_weights(), before)


def test_a_neutral_checkpoint_refuses_a_config(tmp_path, backend):
    path = write_neutral(tmp_path)
    with pytest.raises(ValueError, match="a neutral checkpoint holds its config; do not pass one"):
        backend.checkpoints.load_checkpoint(path, config=TINY)


def test_a_config_mismatch_reads_the_same_whoever_reads_the_file(backend, tmp_path):
    """Each backend's own file, the other's and the neutral directory, loaded into a model of
    another config: one message (the native readers said "the config given ...", the generic one
    "the checkpoint's config differs ..."), and the model keeps its weights."""
    weights = random_weights(TINY, 0)
    save_checkpoint(tmp_path / "n", TINY, weights)
    other = TINY.replace(d_ff=2 * TINY.d_ff)
    model = backend.model(other, random_weights(other, 1))
    files = [tmp_path / "n", tmp_path / "m.pt", tmp_path / "m.weights.h5"]
    for path in files[1:]:
        backend.checkpoints.write_checkpoint(path, TINY, weights)
    for path in files:
        with pytest.raises(ValueError, match=rf"^'.*{path.name}': the config given \(the model's, or "
                                             rf"--config\) differs from the one in the file in d_ff: "
                                             rf"{other.d_ff} vs {TINY.d_ff} \(given vs the file's\)$"):
            backend.checkpoints.load_into(model, path)
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, random_weights(other, 1)[name], err_msg=name)


# -- arguments that are not what they say ---------------------------------------------------------
@pytest.mark.parametrize("call", ["load_checkpoint", "load_into", "read_checkpoint", "shared"])
def test_allow_nonfinite_takes_true_or_false_only(tmp_path, backend, call):
    """Before: any value was read for its truth, so ``allow_nonfinite="no"`` loaded NaN weights."""
    weights = random_weights(TINY, 1)
    weights["generator.bias"][0] = np.nan
    path = tmp_path / "nan"
    path.mkdir()
    write_checkpoint_files(path, TINY, weights)  # the checked writer refuses NaN: written raw
    model = backend.model(TINY, random_weights(TINY, 2))
    before = model.export_weights()
    calls = {"load_checkpoint": lambda v: backend.checkpoints.load_checkpoint(path, allow_nonfinite=v),
             "load_into": lambda v: backend.checkpoints.load_into(model, path, allow_nonfinite=v),
             "read_checkpoint": lambda v: backend.checkpoints.read_checkpoint(path, allow_nonfinite=v),
             "shared": lambda v: load_checkpoint(path, allow_nonfinite=v)}
    for value in ("no", 1, None):
        with pytest.raises(TypeError, match=rf"allow_nonfinite: expected True or False, got {value!r}"):
            calls[call](value)
    assert_same_bytes(model.export_weights(), before)
    calls[call](np.bool_(True))  # NumPy's bool is a bool


@pytest.mark.parametrize("path, error, message", [
    (None, TypeError, "path: expected a str or os.PathLike path, got NoneType"),
    (7, TypeError, "path: expected a str or os.PathLike path, got int"),
    (b"m.pt", TypeError, r"path: expected a str or os.PathLike path, got bytes b'm.pt' \(decode it"),
    ("", ValueError, "path: expected a path, got ''"),
    ("m\0.pt", ValueError, r"path: expected a path without a NUL character, got 'm\\x00.pt'"),
])
def test_a_path_that_is_no_path_is_refused_by_name(backend, path, error, message):
    """Before: Python's own words ("stat: path should be string, ..."), naming no argument; an
    empty path saved as the current directory and failed "Device or resource busy"."""
    model = backend.model(TINY, random_weights(TINY, 1))
    for call in (lambda: backend.checkpoints.save_checkpoint(model, path),
                 lambda: backend.checkpoints.load_checkpoint(path),
                 lambda: backend.checkpoints.load_into(model, path),
                 lambda: save_checkpoint(path, TINY, random_weights(TINY, 1)),
                 lambda: load_checkpoint(path)):
        with pytest.raises(error, match=message):
            call()


def test_the_current_directory_is_not_replaced_by_a_save(tmp_path, backend, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = backend.model(TINY, random_weights(TINY, 1))
    for path in (".", tmp_path):
        with pytest.raises(ValueError, match="expected a directory a save can replace, got the current "
                                             "directory; name a path inside it"):
            backend.checkpoints.save_checkpoint(model, path, format="neutral")
    assert os.listdir(tmp_path) == []


def test_a_config_that_is_no_config_is_named(tmp_path, backend):
    """Before: "given: expected a TransformerConfig", a name inside the library."""
    path = backend.checkpoints.save_checkpoint(backend.model(TINY, random_weights(TINY, 1)), tmp_path / "m")
    with pytest.raises(TypeError, match="^config: expected a TransformerConfig, got str$"):
        backend.checkpoints.load_checkpoint(path, config="tiny")


def test_weights_under_names_of_any_type_or_a_mask_are_problems_not_crashes(backend):
    """Before: names of mixed types crashed sorting them (a bare TypeError comparing str and int);
    a masked array was imported as its data, the masked values with it."""
    model = backend.model(TINY, random_weights(TINY, 1))
    before = model.export_weights()
    weights = random_weights(TINY, 2)
    odd = dict(weights, **{"zz": weights["generator.bias"]})
    odd[1] = odd[None] = weights["generator.bias"]
    with pytest.raises(WeightsError, match=r"unexpected: \[1, None, 'zz'\]"):
        model.import_weights(odd)
    masked = dict(weights)
    masked["generator.bias"] = np.ma.masked_array(weights["generator.bias"], mask=np.arange(TINY.tgt_vocab) < 2)
    with pytest.raises(WeightsError, match="generator.bias: a masked array with 2 masked entries"):
        model.import_weights(masked)
    assert_same_bytes(model.export_weights(), before)
    masked["generator.bias"] = np.ma.masked_array(weights["generator.bias"])  # nothing masked: its values
    model.import_weights(masked)
    assert_same_bytes(model.export_weights(), weights)
