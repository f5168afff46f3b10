"""What only torch_impl has in its weights and files: a dtype round trip through ``.double()``, the
``.pt`` as a plain PyTorch state-dict file (bare state dicts too, both keys of a tied parameter),
and pickles that are not plain state dicts: refused, never executed.

The contracts both backends share are in test_backend_weights.py and test_checkpoints.py.
"""
import io
import pickle
import warnings
import zipfile

import pytest

torch = pytest.importorskip("torch")

import torch_impl  # noqa: E402
from parity_tests.checkpoint_backends import TIED, TINY, assert_same_bytes, write_native  # noqa: E402
from parity_tests.torch_support import build  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import WeightsError, random_weights  # noqa: E402
from torch_impl import checkpoints  # noqa: E402

pytestmark = pytest.mark.torch


def model_with(config, weights):
    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    return model


def test_import_then_move_to_float64_and_back_keeps_weights():
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 2)
    model = build(config, w)
    model.double().float()
    assert all(model.export_weights()[k].tobytes() == v.tobytes() for k, v in w.items())


@pytest.mark.parametrize("convert", ["half", "bfloat16"])
def test_a_model_converted_to_a_half_precision_exports_and_refuses_to_round_an_import(convert, tmp_path):
    """``model.half()`` / ``.bfloat16()`` (inference in the parameters' dtype, which torch_impl
    runs): before, import_weights rounded the weights to it without a word, and export_weights and
    save_checkpoint of a bfloat16 model failed in NumPy's words ("Got unsupported ScalarType
    BFloat16"). Now the export gives what the model holds in config.dtype, exactly, and an import
    is refused naming the model, which keeps its weights."""
    config = TransformerConfig.preset("tiny")
    w = random_weights(config, 2)
    model = getattr(build(config, w), convert)()
    held = {k: v.to(getattr(torch, convert if convert != "half" else "float16")).float().numpy()
            for k, v in {k: torch.from_numpy(v) for k, v in w.items()}.items()}
    assert_same_bytes(model.export_weights(), held)
    torch_impl.save_checkpoint(model, tmp_path / "m.pt")
    assert_same_bytes(torch_impl.load_checkpoint(tmp_path / "m.pt").export_weights(), held)
    with pytest.raises(TypeError, match=rf"^model: expected parameters that hold its config's float32, got "
                                        rf"{'float16' if convert == 'half' else 'bfloat16'} "):
        model.import_weights(random_weights(config, 3))
    assert_same_bytes(model.export_weights(), held)


# -- the .pt is what PyTorch users expect ---------------------------------------------------------
def test_pt_is_a_plain_state_dict_file(tmp_path):
    weights = random_weights(TIED, 1)
    torch_impl.save_checkpoint(model_with(TIED, weights), tmp_path / "m.pt")
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
        torch_impl.load_checkpoint(tmp_path / "bare.pt")
    loaded = torch_impl.load_checkpoint(tmp_path / "bare.pt", config=TIED)
    assert_same_bytes(loaded.export_weights(), weights)
    with pytest.raises(ValueError, match="config given .* differs from the one in the file in "
                                         "d_ff: 64 vs 32"):
        torch_impl.load_checkpoint(tmp_path / "m.pt", config=TIED.replace(d_ff=64))
    torch_impl.save_checkpoint(loaded, tmp_path / "m.pth")  # PyTorch's other suffix is the same format
    assert (tmp_path / "m.pth").read_bytes() == (tmp_path / "m.pt").read_bytes()


def test_tied_keys_that_disagree_are_refused(tmp_path):
    path = write_native(tmp_path, "torch", TIED)
    obj = torch.load(path, weights_only=True)
    obj["state_dict"]["tgt_embed.table.weight"] = obj["state_dict"]["tgt_embed.table.weight"].clone() + 1
    torch.save(obj, path)
    with pytest.raises(WeightsError, match="tgt_embed.table.weight: expected the same values as "
                                           "src_embed.table.weight"):
        torch_impl.load_checkpoint(path)


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
        obj = {"format": checkpoints.PT_FORMAT, "format_version": 1, "config": TINY.to_json(),
               "state_dict": {"src_embed.table.weight": payload}}
    else:
        obj = payload
    torch.save(obj, path)  # a genuine torch.save zip archive
    for load in (lambda: torch_impl.load_checkpoint(path),
                 lambda: checkpoints.read_foreign_state_dict(path)):
        # The project's words exactly; torch's own after the parenthesis only by the global it names
        # (torch 2.13: "Unsupported global: GLOBAL io.open", 2.11: "... GLOBAL _io.open").
        with pytest.raises(ValueError, match=r"evil.pt'?: refused: the pickle holds more than tensors "
                                             r"and plain containers \(.*\b_?io\.open\b"):
            load()
        assert not marker.exists(), "the pickle's code ran"
    # Sanity: the file really does run code when unpickled without weights_only.
    torch.load(path, weights_only=False)
    assert marker.exists()


def _tensor_called_as_a_function(path, values):
    """A ``torch.save`` archive of ``{"w": values}`` whose pickle then calls that tensor with no
    arguments (``)R`` after it): damage the files fuzzer met (``parity_tests.fuzz``, files, seed
    2811), on which torch's weights-only unpickler warns before it refuses."""
    buffer = io.BytesIO()
    torch.save({"w": values}, buffer)
    members = zipfile.ZipFile(buffer)
    with zipfile.ZipFile(path, "w") as out:
        for name in members.namelist():
            data = members.read(name)
            if name.endswith("/data.pkl"):
                assert data.endswith(b"s."), data[-8:]
                data = data[:-2] + b")Rs."  # the tensor on the stack becomes the function called
            out.writestr(name, data)


def test_a_pickle_that_calls_a_tensor_is_refused_in_one_line_without_torch_warnings(tmp_path):
    path = tmp_path / "damaged.pt"
    _tensor_called_as_a_function(path, torch.linspace(-1, 1, 40))  # a repr of several lines
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError) as err:
            torch_impl.load_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"{str(path)!r}: refused: the pickle holds more than tensors and plain "
                              "containers (Trying to call reduce for unrecognized function tensor([")
    assert "\n" not in message and message.endswith("none of its code ran"), message
    assert [str(w.message) for w in caught] == []


def test_a_readable_file_keeps_the_warnings_torch_load_gives(tmp_path, monkeypatch):
    """Only a refused load's warnings are dropped: a good one's reach the caller's filters."""
    path = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, path)
    load = torch.load

    def warning_load(*args, **kwargs):
        warnings.warn("a warning of torch.load's own", UserWarning)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", warning_load)
    with pytest.warns(UserWarning, match="a warning of torch.load's own"):
        assert checkpoints.torch_load(path)["w"].tolist() == [1.0, 1.0]


def test_raw_pickle_and_pickled_module_are_refused(tmp_path):
    marker = tmp_path / "marker"
    with open(tmp_path / "raw.pt", "wb") as f:
        pickle.dump(_Payload(marker), f)  # not a torch.save file at all
    with pytest.raises(ValueError, match="raw.pt'?: not a PyTorch file"):
        torch_impl.load_checkpoint(tmp_path / "raw.pt")
    torch.save(torch_impl.Transformer(TINY), tmp_path / "module.pt")  # a whole pickled nn.Module
    with pytest.raises(ValueError, match="module.pt'?: refused: .*torch_impl.model.Transformer"):
        torch_impl.load_checkpoint(tmp_path / "module.pt")
    assert not marker.exists()


def test_loading_goes_through_weights_only(tmp_path, monkeypatch):
    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "load", spy)
    path = write_native(tmp_path, "torch")
    torch_impl.load_checkpoint(path)
    assert calls and all(c.get("weights_only") is True and c.get("map_location") == "cpu" for c in calls)
