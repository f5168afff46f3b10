"""Porting weights: checkpoint files of both backends (neutral directory, torch ``.pt``, Keras
``.weights.h5``), the byte-identical round trip through the files, and every kind of bad file:
a clear error naming the file, nothing loaded partially, nothing half-written.

`twins convert` is tested in test_porting_convert.py.
"""
import json
import os
import pickle
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import h5py  # noqa: E402
import keras  # noqa: E402

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import WeightsError, random_weights, save_checkpoint  # noqa: E402
from tf_impl import checkpoints as tf_ckpt  # noqa: E402
from torch_impl import checkpoints as torch_ckpt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tf]

TINY = TransformerConfig.preset("tiny")  # float32, pre-norm, annotated norms, separate tables
# float64, post-norm, one shared embedding table that is also the output projection
TIED = TransformerConfig.preset("tiny", tgt_vocab=13, share_embeddings=True, tie_output=True,
                                norm_first=False, norm_style="standard", dtype="float64")
BACKENDS = {"torch": torch_impl.Transformer, "tf": tf_impl.Transformer}
SUFFIX = {"torch": ".pt", "tf": ".weights.h5"}
CKPT = {"torch": torch_ckpt, "tf": tf_ckpt}


def model_with(backend, config, weights):
    model = BACKENDS[backend](config)
    model.import_weights(weights)
    return model


def assert_same_bytes(actual: dict, expected: dict):
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype and actual[name].shape == value.shape, name
        assert actual[name].tobytes() == value.tobytes(), name


# -- the round trip -------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [TINY, TIED], ids=["tiny_float32", "tied_float64"])
def test_round_trip_through_the_files_is_byte_identical(tmp_path, config):
    """torch -> .pt -> neutral -> TF -> .weights.h5 -> neutral -> torch -> .pt: every tensor the
    same bytes (compared as bytes, not within a tolerance), and the files themselves too."""
    weights = random_weights(config, 5)
    weights["generator.bias"][0] = -0.0  # the sign of zero survives too
    model_with("torch", config, weights).save_checkpoint(tmp_path / "a.pt")
    torch_impl.Transformer.from_checkpoint(tmp_path / "a.pt").save_checkpoint(tmp_path / "n1")
    tf_impl.Transformer.from_checkpoint(tmp_path / "n1").save_checkpoint(tmp_path / "b.weights.h5")
    tf_impl.Transformer.from_checkpoint(tmp_path / "b.weights.h5").save_checkpoint(tmp_path / "n2")
    last = torch_impl.Transformer.from_checkpoint(tmp_path / "n2")
    last.save_checkpoint(tmp_path / "c.pt")

    assert last.config == config
    assert_same_bytes(last.export_weights(), weights)
    for path in ("a.pt", "b.weights.h5", "c.pt"):  # each file read on its own
        assert_same_bytes(CKPT["tf" if path.endswith(".h5") else "torch"].read_checkpoint(tmp_path / path)[1],
                          weights)
    first = torch.load(tmp_path / "a.pt", weights_only=True)["state_dict"]
    again = torch.load(tmp_path / "c.pt", weights_only=True)["state_dict"]
    assert list(first) == list(again)
    for key in first:
        assert first[key].dtype == again[key].dtype
        assert first[key].numpy().tobytes() == again[key].numpy().tobytes(), key
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "c.pt").read_bytes()
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "n1" / name).read_bytes() == (tmp_path / "n2" / name).read_bytes()


# -- the native files are what each framework's users expect --------------------------------------
def test_pt_is_a_plain_state_dict_file(tmp_path):
    weights = random_weights(TIED, 1)
    model_with("torch", TIED, weights).save_checkpoint(tmp_path / "m.pt")
    obj = torch.load(tmp_path / "m.pt", weights_only=True, map_location="cpu")
    assert sorted(obj) == ["config", "format", "format_version", "state_dict"]
    assert obj["format_version"] == 1 and TransformerConfig.from_json(obj["config"]) == TIED
    plain = torch_impl.Transformer(TIED)
    assert list(obj["state_dict"]) == list(plain.state_dict())  # both names of the shared table
    plain.load_state_dict(obj["state_dict"])  # plain PyTorch, strict
    assert_same_bytes(plain.export_weights(), weights)
    # A bare state dict (torch.save(model.state_dict())) is read given the config, refused without.
    torch.save(plain.state_dict(), tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="bare.pt.*holds a bare state dict and no config.*"
                                         "--from nn-transformer"):
        torch_impl.Transformer.from_checkpoint(tmp_path / "bare.pt")
    loaded = torch_impl.Transformer.from_checkpoint(tmp_path / "bare.pt", config=TIED)
    assert_same_bytes(loaded.export_weights(), weights)
    with pytest.raises(ValueError, match="config given .* differs from the one in the file in "
                                         "d_ff: 64 vs 32"):
        torch_impl.Transformer.from_checkpoint(tmp_path / "m.pt", config=TIED.replace(d_ff=64))
    loaded.save_checkpoint(tmp_path / "m.pth")  # PyTorch's other suffix is the same format
    assert (tmp_path / "m.pth").read_bytes() == (tmp_path / "m.pt").read_bytes()


def test_h5_is_a_keras_weights_file_with_the_config_inside(tmp_path):
    weights = random_weights(TINY, 2)
    model_with("tf", TINY, weights).save_checkpoint(tmp_path / "m.weights.h5")
    assert sorted(os.listdir(tmp_path)) == ["m.weights.h5"]  # no sidecar, no temporary left
    with h5py.File(tmp_path / "m.weights.h5", "r") as f:
        assert TransformerConfig.from_json(f.attrs["twin_transformer.config"]) == TINY
        assert f.attrs["twin_transformer.format_version"] == 1
    plain = tf_impl.Transformer(TINY)
    plain.load_weights(str(tmp_path / "m.weights.h5"))  # plain Keras ignores the attributes
    assert_same_bytes(plain.export_weights(), weights)
    # A file from plain Keras save_weights holds no config: read given one, refused without.
    plain.save_weights(str(tmp_path / "keras.weights.h5"))
    with pytest.raises(ValueError, match="keras.weights.h5.*holds no config.*--config"):
        tf_impl.Transformer.from_checkpoint(tmp_path / "keras.weights.h5")
    loaded = tf_impl.Transformer.from_checkpoint(tmp_path / "keras.weights.h5", config=TINY)
    assert_same_bytes(loaded.export_weights(), weights)


@pytest.mark.parametrize("backend", BACKENDS)
def test_neutral_checkpoint_from_either_backend_computes_the_same(tmp_path, backend):
    from shared.batches import src_tgt
    from shared.tolerances import assert_close, bound_for
    from shared import reference

    config, weights = TINY, random_weights(TINY, 3)
    save_checkpoint(tmp_path / "c", config, weights)
    model = BACKENDS[backend].from_checkpoint(tmp_path / "c")
    src, tgt = src_tgt(config, 2, 7, 5)
    with torch.no_grad():
        logits = model(torch.as_tensor(src), torch.as_tensor(tgt)) if backend == "torch" else model(src, tgt)
    assert_close(np.asarray(logits), reference.forward(weights, config, src, tgt),
                 bound_for("float32", f"{backend}:reference"), "logits")


# -- bad files ------------------------------------------------------------------------------------
def write_neutral(tmp_path, config=TINY, weights=None):
    weights = random_weights(config, 0) if weights is None else weights
    return save_checkpoint(tmp_path / "ckpt", config, weights)


def write_native(tmp_path, backend, config=TINY):
    path = tmp_path / f"m{SUFFIX[backend]}"
    CKPT[backend].write_checkpoint(path, config, random_weights(config, 0))
    return path


def rewrite_pt(path, **changes):
    """Rewrite a .pt's payload (not through save_pt, which refuses bad weights)."""
    obj = torch.load(path, weights_only=True)
    for key, value in changes.items():
        if callable(value):
            value(obj)
        else:
            obj[key] = value
    torch.save(obj, path)


def h5_path_of(name, config=TINY):
    return next(p for p, (n, _, _) in tf_ckpt.h5_layout(config).items() if n == name)


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


def native_cases(backend):
    torch_side = backend == "torch"
    name = f"m{SUFFIX[backend]}"

    def missing(tmp):
        return tmp / name, FileNotFoundError, "no such file"

    def truncated(tmp):
        path = write_native(tmp, backend)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path, ValueError, "not a PyTorch file" if torch_side else "not a readable HDF5 file"

    def text(tmp):
        (tmp / name).write_text("just some text\n")
        return tmp / name, ValueError, "not a PyTorch file" if torch_side else "not a readable HDF5 file"

    def other_format(tmp):  # the other backend's native file under this backend's name
        other = write_native(tmp, "tf" if torch_side else "torch")
        os.replace(other, tmp / name)
        return tmp / name, ValueError, "not a PyTorch file" if torch_side else "not a readable HDF5 file"

    def contradicting_config(tmp):
        path = write_native(tmp, backend)
        bad = TINY.replace(d_ff=24).to_json()
        if torch_side:
            rewrite_pt(path, config=bad)
            return path, WeightsError, (r"ffn.inner.weight: expected shape \(24, 16\) \(from the config\), "
                                        r"got \(32, 16\)")
        with h5py.File(path, "r+") as f:
            f.attrs["twin_transformer.config"] = bad
        return path, WeightsError, r"\(encoder.layers.0.ffn.inner.kernel\): expected shape \(16, 24\)"

    def version(tmp):
        path = write_native(tmp, backend)
        if torch_side:
            rewrite_pt(path, format_version=2)
        else:
            with h5py.File(path, "r+") as f:
                f.attrs["twin_transformer.format_version"] = 2
        return path, ValueError, "unknown format_version 2, this version reads 1"

    def wrong_dtype(tmp):
        path = write_native(tmp, backend)
        if torch_side:
            def to_double(obj):
                obj["state_dict"] = {k: v.double() for k, v in obj["state_dict"].items()}
            rewrite_pt(path, state_dict=to_double)
            return path, WeightsError, r"generator.bias: expected dtype float32 \(the config's\), got float64"
        with h5py.File(path, "r+") as f:
            p = h5_path_of("generator.bias")
            value = f[p][...]
            del f[p]
            f.create_dataset(p, data=value.astype(np.float64))
        return path, WeightsError, r"\(generator.bias\): expected dtype float32 \(the config's\), got float64"

    def nonfinite(tmp):
        path = write_native(tmp, backend)
        if torch_side:
            def poison(obj):
                obj["state_dict"]["decoder.final_norm.beta"][1] = float("nan")
            rewrite_pt(path, state_dict=poison)
            return path, WeightsError, "decoder.final_norm.beta: contains NaN or Inf"
        with h5py.File(path, "r+") as f:
            f[h5_path_of("decoder.final_norm.beta")][1] = np.nan
        return path, WeightsError, r"\(decoder.final_norm.beta\): contains NaN or Inf"

    def foreign_file(tmp):  # the neutral sibling format is fine; a file of the other backend is not
        other = write_native(tmp, "tf" if torch_side else "torch")
        return other, ValueError, "reads and writes a neutral checkpoint directory or a"

    return {f.__name__: f for f in (missing, truncated, text, other_format, contradicting_config,
                                    version, wrong_dtype, nonfinite, foreign_file)}


CASES = [(b, "neutral", n) for b in BACKENDS for n in neutral_cases()] + \
        [(b, "native", n) for b in BACKENDS for n in native_cases(b)]


@pytest.fixture(scope="module")
def loaded_models():
    """One model per backend, loaded before each bad file is tried on it (never changed by them)."""
    return {b: model_with(b, TINY, random_weights(TINY, 9)) for b in BACKENDS}


@pytest.mark.parametrize("backend, kind, case", CASES, ids=[f"{b}-{k}-{n}" for b, k, n in CASES])
def test_bad_file_is_refused_by_name_and_changes_nothing(tmp_path, loaded_models, backend, kind, case):
    make = (neutral_cases() if kind == "neutral" else native_cases(backend))[case]
    path, error, needle = make(tmp_path)
    with pytest.raises(error, match=needle) as info:
        BACKENDS[backend].from_checkpoint(path)
    assert str(path) in str(info.value), f"the message does not name {path}: {info.value}"
    model = loaded_models[backend]
    before = model.export_weights()
    # Loading into a model: the same refusal (or, where the file's config is what is wrong, the
    # mismatch with the model's config), and the model keeps its weights.
    with pytest.raises(FileNotFoundError if error is FileNotFoundError else ValueError) as info:
        CKPT[backend].load_into(model, path)
    assert str(path) in str(info.value)
    assert_same_bytes(model.export_weights(), before)


def test_every_problem_is_reported_at_once(tmp_path):
    path = write_native(tmp_path, "torch")

    def damage(obj):
        sd = obj["state_dict"]
        del sd["generator.bias"]
        sd["extra.weight"] = torch.zeros(2)
        sd["encoder.layers.1.ffn.inner.weight"] = torch.zeros(3, 3)
        sd["tgt_embed.table.weight"] = sd["tgt_embed.table.weight"].half()
        sd["src_embed.table.weight"][0, 0] = float("inf")
    rewrite_pt(path, state_dict=damage)
    with pytest.raises(WeightsError) as info:
        torch_impl.Transformer.from_checkpoint(path)
    assert len(info.value.problems) == 5, info.value.problems
    for text in ("missing keys: ['generator.bias']", "unexpected keys: ['extra.weight']",
                 "encoder.layers.1.ffn.inner.weight: expected shape (32, 16) (from the config), got (3, 3)",
                 "tgt_embed.table.weight: expected dtype float32 (the config's), got float16",
                 "src_embed.table.weight: contains NaN or Inf"):
        assert text in str(info.value)


def test_tied_keys_that_disagree_are_refused(tmp_path):
    path = write_native(tmp_path, "torch", TIED)
    rewrite_pt(path, state_dict=lambda obj: obj["state_dict"].__setitem__(
        "tgt_embed.table.weight", obj["state_dict"]["tgt_embed.table.weight"].clone() + 1))
    with pytest.raises(WeightsError, match="tgt_embed.table.weight: expected the same values as "
                                           "src_embed.table.weight"):
        torch_impl.Transformer.from_checkpoint(path)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["neutral", "native"])
def test_nonfinite_weights_load_only_when_allowed(tmp_path, backend, kind):
    make = neutral_cases()["nonfinite"] if kind == "neutral" else native_cases(backend)["nonfinite"]
    path, _, _ = make(tmp_path)
    model = BACKENDS[backend].from_checkpoint(path, allow_nonfinite=True)
    assert not np.isfinite(model.export_weights()["decoder.final_norm.beta" if kind == "native"
                                                  else "src_embed.embeddings"]).all()
    # Saving always refuses them, and writes nothing.
    with pytest.raises(WeightsError, match="contains NaN or Inf"):
        model.save_checkpoint(tmp_path / f"again{SUFFIX[backend]}")
    with pytest.raises(WeightsError, match="contains NaN or Inf"):
        model.save_checkpoint(tmp_path / "again_dir")
    assert not [p for p in os.listdir(tmp_path) if p.startswith(("again", ".again"))]


# -- pickles that are not plain state dicts: refused, never executed ------------------------------
class _Payload:
    """Unpickling this calls ``open(marker, "w")``: it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("where", ["whole_file", "inside_state_dict"])
def test_pickle_that_would_run_code_is_refused_not_executed(tmp_path, where):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    payload = _Payload(marker)
    if where == "inside_state_dict":
        obj = {"format": torch_ckpt.PT_FORMAT, "format_version": 1, "config": TINY.to_json(),
               "state_dict": {"src_embed.table.weight": payload}}
    else:
        obj = payload
    torch.save(obj, path)  # a genuine torch.save zip archive
    for load in (lambda: torch_impl.Transformer.from_checkpoint(path),
                 lambda: torch_ckpt.read_foreign_state_dict(path)):
        with pytest.raises(ValueError, match=r"evil.pt'?: refused: the pickle holds more than tensors "
                                             r"and plain containers \(Unsupported global: GLOBAL io.open"):
            load()
        assert not marker.exists(), "the pickle's code ran"
    # Sanity: the file really does run code when unpickled without weights_only.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_raw_pickle_and_pickled_module_are_refused(tmp_path):
    marker = tmp_path / "marker"
    with open(tmp_path / "raw.pt", "wb") as f:
        pickle.dump(_Payload(marker), f)  # not a torch.save file at all
    with pytest.raises(ValueError, match="raw.pt'?: not a PyTorch file"):
        torch_impl.Transformer.from_checkpoint(tmp_path / "raw.pt")
    torch.save(torch_impl.Transformer(TINY), tmp_path / "module.pt")  # a whole pickled nn.Module
    with pytest.raises(ValueError, match="module.pt'?: refused: .*torch_impl.model.Transformer"):
        torch_impl.Transformer.from_checkpoint(tmp_path / "module.pt")
    assert not marker.exists()


def test_loading_goes_through_weights_only(tmp_path, monkeypatch):
    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "load", spy)
    path = write_native(tmp_path, "torch")
    torch_impl.Transformer.from_checkpoint(path)
    assert calls and all(c.get("weights_only") is True and c.get("map_location") == "cpu" for c in calls)


# -- no file half-written -------------------------------------------------------------------------
def test_crash_while_saving_pt_keeps_the_old_file(tmp_path, monkeypatch):
    path = write_native(tmp_path, "torch")
    old = path.read_bytes()

    def broken(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        model_with("torch", TINY, random_weights(TINY, 1)).save_checkpoint(path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == [path.name]
    with pytest.raises(OSError, match="disk full"):
        model_with("torch", TINY, random_weights(TINY, 1)).save_checkpoint(tmp_path / "new.pt")
    assert os.listdir(tmp_path) == [path.name]


def test_crash_while_saving_h5_keeps_the_old_file(tmp_path, monkeypatch):
    path = write_native(tmp_path, "tf")
    old = path.read_bytes()

    def broken(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n half a file")
        raise OSError("disk full")
    monkeypatch.setattr(keras.Model, "save_weights", broken)
    model = model_with("tf", TINY, random_weights(TINY, 1))
    for target in (path, tmp_path / "new.weights.h5"):
        with pytest.raises(OSError, match="disk full"):
            model.save_checkpoint(target)
        assert path.read_bytes() == old and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_refuses_to_replace_a_directory_or_another_format(tmp_path, backend):
    model = model_with(backend, TINY, random_weights(TINY, 1))
    (tmp_path / f"d{SUFFIX[backend]}").mkdir()
    with pytest.raises(FileExistsError, match="is a directory"):
        model.save_checkpoint(tmp_path / f"d{SUFFIX[backend]}")
    other = write_native(tmp_path, "tf" if backend == "torch" else "torch")
    with pytest.raises(ValueError, match="neither"):
        model.save_checkpoint(other)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a checkpoint; refusing"):
        model.save_checkpoint(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_load_into_refuses_another_config(tmp_path):
    path = write_native(tmp_path, "torch")
    model = model_with("torch", TINY.replace(dropout=0.3), random_weights(TINY, 1))
    before = model.export_weights()
    with pytest.raises(ValueError, match="differs from the one in the file in dropout: 0.3 vs 0.1"):
        torch_ckpt.load_into(model, path)
    neutral_dir = write_neutral(tmp_path)
    with pytest.raises(ValueError, match="config differs from the model's in dropout: 0.3 vs 0.1"):
        tf_ckpt.load_into(model_with("tf", TINY.replace(dropout=0.3), random_weights(TINY, 1)), neutral_dir)
    assert_same_bytes(model.export_weights(), before)
    shutil.rmtree(neutral_dir)
