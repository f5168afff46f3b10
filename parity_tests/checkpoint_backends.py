"""Both backends behind one face, for the contract tests of weights and checkpoint files
(test_backend_weights.py, test_checkpoints.py): each contract is written once, runs for each.

`BACKENDS` names them; the ``backend`` fixture of those files gives a `TorchSide` or a `TFSide`,
importing its framework only then. Each side has the same methods: what differs between the
frameworks (how a native file is damaged, the label a native reader gives a tensor, how weights are
held) is here, so that the tests say only what both must do; running a model is the CPU
`parity_tests.backends.Backend`'s.
"""
from __future__ import annotations

import numpy as np

from parity_tests.backends import Backend, build_model
from shared import TransformerConfig
from shared.weights import random_weights

BACKENDS = ("torch", "tf")
TINY = TransformerConfig.preset("tiny")  # float32, pre-norm, annotated norms, separate tables
# float64, post-norm, one shared embedding table that is also the output projection
TIED = TransformerConfig.preset("tiny", tgt_vocab=13, share_embeddings=True, tie_output=True,
                                norm_first=False, norm_style="standard", dtype="float64")


class _Side:
    """What both sides share: the backend's package, its checkpoints and weights_io modules, and
    its models, run on the CPU `Backend`."""

    name: str
    device: str

    def __init__(self, checkpoints, weights_io):
        """``checkpoints``, ``weights_io``: the backend's modules of those names."""
        self.backend = Backend(self.name, "eager", self.device)
        self.impl, self.Transformer = self.backend.impl, self.backend.impl.Transformer
        self.checkpoints, self.weights_io = checkpoints, weights_io

    def model(self, config, weights=None):
        """A fresh model of ``config`` holding ``weights`` (None: the framework's initialisation)."""
        return build_model(self.name, self.device, config, weights)

    def logits(self, model, src, tgt) -> np.ndarray:
        return self.backend.logits(model, src, tgt)

    def tensor(self, array):
        return self.backend.tensor(array)

    def label(self, name: str, config=TINY) -> str:
        """The native file's key of a canonical weight (the first, for a tied one)."""
        return next(k for k, s in self.checkpoints.native_layout(config).items() if s.name == name)


class TorchSide(_Side):
    name, device = "torch", "cpu"
    suffix = ".pt"
    other = "tf"
    not_native = "not a PyTorch file"  # a file under the suffix that is no torch.save archive
    # the refusal of a file whose stored config contradicts its tensors (d_ff 24, tensors of 32)
    contradicting = r"ffn.inner.weight: expected shape \(24, 16\) \(from the config\), got \(32, 16\)"

    def __init__(self):
        import torch

        from torch_impl import checkpoints, weights_io
        super().__init__(checkpoints, weights_io)
        self.torch = torch

    def trainable(self, model) -> list:
        return list(model.parameters())  # shared parameters once

    def table_ids(self, model) -> list[int]:
        return [id(p) for p, _ in self.weights_io.weight_table(model).values()]

    def dtypes(self, model) -> set[str]:
        return {str(p.dtype).removeprefix("torch.") for p in self.trainable(model)}

    def scale_tgt_rows(self, model, start: int, factor: float) -> None:
        with self.torch.no_grad():
            model.tgt_embed.table.weight[start:].mul_(factor)

    def positional(self, model) -> tuple[bool, str, tuple]:
        """(is it saved as a weight?, dtype, shape) of the positional table."""
        table = model.positional.table
        return ("positional.table" in model.state_dict(), str(table.dtype).removeprefix("torch."),
                tuple(table.shape))

    # -- native files ------------------------------------------------------------------------------
    def rewrite(self, path, change) -> None:
        """Rewrite a .pt's payload with ``change(obj)`` (not through write_native, which checks)."""
        obj = self.torch.load(path, weights_only=True)
        change(obj)
        self.torch.save(obj, path)

    def set_config(self, path, text: str) -> None:
        self.rewrite(path, lambda obj: obj.__setitem__("config", text))

    def set_version(self, path, version: int) -> None:
        self.rewrite(path, lambda obj: obj.__setitem__("format_version", version))

    def to_float64(self, path, name: str) -> None:
        key = self.label(name)
        self.rewrite(path, lambda obj: obj["state_dict"].__setitem__(key, obj["state_dict"][key].double()))

    def poison(self, path, name: str) -> None:
        key = self.label(name)

        def change(obj):
            obj["state_dict"][key][1] = float("nan")
        self.rewrite(path, change)

    def damage_everything(self, path) -> list[str]:
        """Five problems in one file; returns the texts the error must hold."""
        def change(obj):
            sd = obj["state_dict"]
            del sd["generator.bias"]
            sd["extra.weight"] = self.torch.zeros(2)
            sd["encoder.layers.1.ffn.inner.weight"] = self.torch.zeros(3, 3)
            sd["tgt_embed.table.weight"] = sd["tgt_embed.table.weight"].half()
            sd["src_embed.table.weight"][0, 0] = float("inf")
        self.rewrite(path, change)
        return ["missing keys: ['generator.bias']", "unexpected keys: ['extra.weight']",
                "encoder.layers.1.ffn.inner.weight: expected shape (32, 16) (from the config), got (3, 3)",
                "tgt_embed.table.weight: expected dtype float32 (the config's), got float16",
                "src_embed.table.weight: contains NaN or Inf"]

    def break_writer(self, monkeypatch) -> None:
        """Make the native writer fail half-way, after writing part of its file."""
        def broken(obj, f, *args, **kwargs):
            f.write(b"PK\x03\x04 half an archive")
            raise OSError("disk full")
        monkeypatch.setattr(self.torch, "save", broken)


class TFSide(_Side):
    name, device = "tf", "/CPU:0"
    suffix = ".weights.h5"
    other = "torch"
    not_native = "not a readable HDF5 file"
    contradicting = r"\(encoder.layers.0.ffn.inner.kernel\): expected shape \(16, 24\)"

    def __init__(self):
        import h5py
        import keras
        import tensorflow as tf

        from tf_impl import checkpoints, weights_io
        super().__init__(checkpoints, weights_io)
        self.tf, self.keras, self.h5py = tf, keras, h5py

    def trainable(self, model) -> list:
        return list(model.trainable_weights)

    def table_ids(self, model) -> list[int]:
        return [id(v) for v in self.weights_io.weight_table(model).values()]

    def dtypes(self, model) -> set[str]:
        return {str(v.dtype) for v in model.weights}

    def scale_tgt_rows(self, model, start: int, factor: float) -> None:
        table = model.tgt_embed.embeddings
        table.assign(self.tf.concat([table[:start], table[start:] * factor], axis=0))

    def positional(self, model) -> tuple[bool, str, tuple]:
        table = model.positional.table
        return (any("positional" in v.path for v in model.weights), table.dtype.name, tuple(table.shape))

    # -- native files ------------------------------------------------------------------------------
    def set_config(self, path, text: str) -> None:
        with self.h5py.File(path, "r+") as f:
            f.attrs["twin_transformer.config"] = text

    def set_version(self, path, version: int) -> None:
        with self.h5py.File(path, "r+") as f:
            f.attrs["twin_transformer.format_version"] = version

    def _replace(self, f, name: str, value) -> None:
        p = self.label(name)
        del f[p]
        f.create_dataset(p, data=value)

    def to_float64(self, path, name: str) -> None:
        with self.h5py.File(path, "r+") as f:
            self._replace(f, name, f[self.label(name)][...].astype(np.float64))

    def poison(self, path, name: str) -> None:
        with self.h5py.File(path, "r+") as f:
            f[self.label(name)][1] = np.nan

    def damage_everything(self, path) -> list[str]:
        labels = {n: f"{self.label(n)} ({n})" for n in ("generator.bias", "encoder.layers.1.ffn.inner.kernel",
                                                        "tgt_embed.embeddings", "src_embed.embeddings")}
        with self.h5py.File(path, "r+") as f:
            del f[self.label("generator.bias")]
            f.create_dataset("extra/vars/0", data=np.zeros(2, np.float32))
            self._replace(f, "encoder.layers.1.ffn.inner.kernel", np.zeros((3, 3), np.float32))
            self._replace(f, "tgt_embed.embeddings",
                          f[self.label("tgt_embed.embeddings")][...].astype(np.float16))
            f[self.label("src_embed.embeddings")][0, 0] = np.inf
        return [f"missing datasets: [{labels['generator.bias']!r}]", "unexpected datasets: ['extra/vars/0']",
                f"{labels['encoder.layers.1.ffn.inner.kernel']}: expected shape (16, 32) (from the config), "
                "got (3, 3)",
                f"{labels['tgt_embed.embeddings']}: expected dtype float32 (the config's), got float16",
                f"{labels['src_embed.embeddings']}: contains NaN or Inf"]

    def break_writer(self, monkeypatch) -> None:
        def broken(model, filepath, *args, **kwargs):
            with open(filepath, "wb") as f:
                f.write(b"\x89HDF\r\n\x1a\n half a file")
            raise OSError("disk full")
        monkeypatch.setattr(self.keras.Model, "save_weights", broken)


_SIDES: dict[str, object] = {}


def side(name: str):
    """The `TorchSide` or `TFSide` (one per process: building it imports the framework)."""
    if name not in _SIDES:
        _SIDES[name] = TorchSide() if name == "torch" else TFSide()
    return _SIDES[name]


def write_native(tmp_path, name: str, config=TINY, weights=None):
    """A native file of backend ``name`` written by its checkpoints module."""
    s = side(name)
    path = tmp_path / f"m{s.suffix}"
    s.checkpoints.write_checkpoint(path, config, random_weights(config, 0) if weights is None else weights)
    return path


def assert_same_bytes(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype and actual[name].shape == value.shape, name
        assert actual[name].tobytes() == value.tobytes(), name
