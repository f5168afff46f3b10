"""Keras 3 weight files read without running code: a ``.weights.h5`` (``save_weights``) or a
``.keras`` archive (``model.save``). NumPy + h5py (imported when a file is read).

A ``.weights.h5`` is an HDF5 tree that mirrors the model's Python object tree: each layer is a group
named after the attribute that holds it (``encoder``, ``final_layer``) or, inside a list (a
functional model's ``layers``, a subclassed model's list attribute), after its class in snake case
with a counter in list order (``transformer_encoder``, ``transformer_encoder_1``, ...); the layer's
own variables are the datasets ``vars/0``, ``vars/1`` ... in creation order (Dense: kernel, bias;
LayerNormalization: gamma, beta). `read_keras_file` returns them flat, ``{"group/path/vars/i":
array}``, which the importers map by path.

A ``.keras`` file is a zip of ``config.json`` (the architecture), ``metadata.json`` and
``model.weights.h5``. Only the JSON and the weights are read; Keras itself is never asked to load
the file. A config that names a layer whose loading would run code (a ``Lambda``, a Python function
or lambda, a class outside ``keras`` / ``keras_hub``) is refused all the same: the user asked to
port that model, and this model is not the one in the file.
"""
from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import parse_json
from ..paths import check_source
from .common import ImporterError

# Groups Keras saves beside the model (training state): not part of the network, skipped.
TRAINING_STATE = ("optimizer", "compile_metrics", "metrics", "loss_tracker")
# Modules whose layers Keras can rebuild from the config without user code.
TRUSTED_MODULES = ("keras", "keras_hub")
_CODE_CLASSES = {"Lambda", "TFOpLambda", "SlicingOpLambda", "__lambda__", "__function__"}
# Keras layers that compute the identity at inference, and which an import may therefore leave out:
# dropout and noise layers act only in training, ActivityRegularization only adds a training loss.
INFERENCE_IDENTITY = ("ActivityRegularization", "AlphaDropout", "Dropout", "GaussianDropout",
                      "GaussianNoise", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D")
# The model structure around the layers: nested models (walked into) and their inputs.
_MODELS = ("Functional", "Sequential")
_STRUCTURE = (*_MODELS, "InputLayer")


@dataclass(frozen=True)
class KerasFile:
    """A Keras file's variables ``{h5 path: array}`` and, for a ``.keras`` archive, its config."""

    path: str
    weights: dict[str, np.ndarray]
    config: dict | None


def read_keras_file(path) -> KerasFile:
    """Read ``path`` (``*.weights.h5`` or ``*.keras``) into a `KerasFile`.

    Raises:
        ImporterError: not an HDF5 file / not a Keras archive, a dataset that cannot be read, or a
            ``.keras`` config that names code (every such layer named).
        FileNotFoundError: no such file.
        ImportError: h5py is not installed (naming the file and the install command).
    """
    path = str(path)
    try:
        check_source(path, directory=False)  # a directory, a FIFO, a device: named as that
    except ValueError as err:
        raise ImporterError(repr(path), [str(err)]) from None
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path!r}: no such file")
    _check_h5py(path)
    if path.endswith(".keras"):
        return _read_archive(path)
    return KerasFile(path, _read_h5(path, path), None)


# Keras stores its archive's members uncompressed, and DEFLATE expands at most about 1032 times:
# a member past the floor that declares 100 times what it stores is a decompression bomb (the rule
# and figures of Keras' own loader, keras.src.saving.saving_lib._reject_zip_bomb).
_BOMB_FLOOR = 1 << 28  # 256 MiB
_BOMB_RATIO = 100


def _member(archive: zipfile.ZipFile, name: str, path: str) -> bytes:
    """The bytes of the member ``name``, a decompression bomb refused from its declared sizes
    before anything is decompressed."""
    info = archive.getinfo(name)
    if info.file_size > _BOMB_FLOOR and info.file_size > _BOMB_RATIO * info.compress_size:
        raise ImporterError(repr(path), [f"{name}: declares {info.file_size:,} bytes stored in "
                                         f"{info.compress_size:,}: a decompression bomb, not read"])
    return archive.read(name)


def _read_archive(path: str) -> KerasFile:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            missing = [n for n in ("config.json", "model.weights.h5") if n not in names]
            if missing:
                raise ImporterError(repr(path), [f"not a Keras 3 .keras archive: no {missing} "
                                                 f"(found {sorted(names)[:10]})"])
            config = parse_json(_member(archive, "config.json", path).decode("utf-8"), "config.json")
            data = _member(archive, "model.weights.h5", path)
    except ImporterError:
        raise
    except (zipfile.BadZipFile, UnicodeDecodeError, ValueError) as err:  # ValueError: parse_json's
        raise ImporterError(repr(path), [f"not a Keras 3 .keras archive ({err})"]) from None
    problems = code_in_config(config)
    if problems:
        raise ImporterError(repr(path), problems)
    return KerasFile(path, _read_h5(io.BytesIO(data), f"{path}:model.weights.h5"), config)


# Who installs h5py: the `interop` extra (the formats models are ported from), and `tf` / `tf-cpu`
# (tf_impl's own .weights.h5); pyproject.toml.
H5PY_MISSING = ("a Keras file (.keras, .weights.h5; --from keras-hub, tf-tutorial) is read with h5py, which "
                "is not installed ({err}); install the 'interop' extra, or h5py alone: pip install 'h5py>=3.11'")


def _check_h5py(path: str) -> None:
    """An ImportError naming ``path``, the format and the install command where h5py is missing."""
    try:
        import h5py  # noqa: F401  (deferred: `import shared` stays NumPy only)
    except ImportError as err:
        raise ImportError(f"{path!r}: " + H5PY_MISSING.format(err=err)) from None


# zlib's largest expansion: a deflated dataset holds at most this many bytes per stored byte
_DEFLATE_MAX_RATIO = 1032


def _size_of(source) -> int:
    """The bytes of an HDF5 source: a path's file size, an in-memory file's length."""
    return len(source.getbuffer()) if isinstance(source, io.BytesIO) else os.path.getsize(source)


def _check_declared_sizes(handle, label: str, size: int) -> None:
    """Refuse a file whose datasets declare more bytes than it can hold, before any is read: an
    unfiltered dataset's values are stored in the file, so together they cannot exceed its size, and
    a compressed one's cannot exceed zlib's largest expansion of it. Past that the values are HDF5's
    fill value for chunks never written: a 127 KB file declaring a 30000 x 30000 dataset would be
    read as 3.6 GB of zeros."""
    import h5py

    plain = packed = 0

    def visit(name: str, obj) -> None:
        nonlocal plain, packed
        if isinstance(obj, h5py.Dataset):
            declared = obj.size * obj.dtype.itemsize
            if obj.id.get_create_plist().get_nfilters() == 0:  # no compression nor any filter
                plain += declared
            else:
                packed += declared
    handle.visititems(visit)
    if plain > size or packed > _DEFLATE_MAX_RATIO * size:
        raise ImporterError(repr(label), [f"its datasets declare {plain + packed:,} bytes of values, "
                                          f"more than a file of {size:,} bytes holds; refused before "
                                          "reading (unwritten values would be read as zeros)"])


def _read_h5(source, label: str) -> dict[str, np.ndarray]:
    import h5py  # deferred: `import shared` stays NumPy only (present: `_check_h5py`)

    out: dict[str, np.ndarray] = {}
    problems: list[str] = []
    try:
        with h5py.File(source, "r") as handle:
            _check_declared_sizes(handle, label, _size_of(source))

            def visit(name: str, obj) -> None:
                if isinstance(obj, h5py.Dataset) and name.split("/")[0] not in TRAINING_STATE:
                    try:
                        out[name] = np.array(obj[()])
                    except (OSError, RuntimeError, TypeError, ValueError) as err:
                        problems.append(f"{name}: cannot be read ({err})")
            handle.visititems(visit)
    except OSError as err:  # h5py cannot open it
        raise ImporterError(repr(label), [f"not a readable HDF5 .weights.h5 file ({err})"]) from None
    except (RuntimeError, KeyError) as err:  # h5py opened it, then met damage walking its groups
        raise ImporterError(repr(label), [f"a damaged HDF5 file ({type(err).__name__}: {err})"]) from None
    if problems:
        raise ImporterError(repr(label), problems)
    return out


def code_in_config(config: Any) -> list[str]:
    """Every object of a ``.keras`` config whose loading would run code, as problem lines."""
    problems: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            cls, module = node.get("class_name"), node.get("module")
            name = node.get("config", {}).get("name") if isinstance(node.get("config"), dict) else None
            label = f"{where}: {cls}" + (f" {name!r}" if name else "")
            if cls in _CODE_CLASSES:
                problems.append(f"{label}: loading it would execute Python code from the file; refusing")
            elif isinstance(cls, str) and isinstance(module, str) and \
                    module.split(".")[0] not in TRUSTED_MODULES:
                problems.append(f"{label} from module {module!r}: a custom class, whose loading would "
                                f"run that module's code; only {TRUSTED_MODULES} layers are accepted")
            elif isinstance(node.get("registered_name"), str) and ">" in node["registered_name"] \
                    and node["registered_name"].split(">")[0] not in TRUSTED_MODULES:
                problems.append(f"{label}: registered custom object {node['registered_name']!r}, "
                                "whose loading would run user code; refusing")
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(config, "")
    return problems


def unaccounted_layers(config: Any, mapped: tuple[str, ...]) -> list[str]:
    """Every layer of a ``.keras`` model config that an importer mapping the classes ``mapped`` would
    silently drop, as problem lines naming it: a layer is mapped, or in `INFERENCE_IDENTITY` (or an
    ``Activation("linear")``), or refused (an ``Activation("tanh")`` in place of a ``Dropout`` would
    otherwise convert, and compute something else). Nested ``Functional`` / ``Sequential`` models are
    walked; ``InputLayer`` s are the inputs."""
    problems: list[str] = []

    def walk(node: Any, where: str) -> None:
        if not isinstance(node, dict):
            return
        cls, conf = node.get("class_name"), node.get("config")
        conf = conf if isinstance(conf, dict) else {}
        name = conf.get("name")
        here = f"{where}/{name}" if where else str(name)
        if cls in _MODELS:
            for layer in conf.get("layers") or []:
                walk(layer, here)
            return
        linear = cls == "Activation" and conf.get("activation") in ("linear", None)
        if cls in mapped or cls in _STRUCTURE or cls in INFERENCE_IDENTITY or linear:
            return
        what = f"{cls}({conf.get('activation')!r})" if cls == "Activation" else str(cls)
        problems.append(f"layer {here!r}: {what} is not a layer this import maps ({', '.join(mapped)}) "
                        f"nor one known not to change inference ({', '.join(INFERENCE_IDENTITY)}); "
                        "the import would drop what it computes, so it is refused")

    walk(config, "")
    return problems


def layer_configs(config: Any, class_name: str) -> list[dict]:
    """The ``config`` dicts of every layer of ``class_name`` in a ``.keras`` config, in file order."""
    found: list[dict] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("class_name") == class_name and isinstance(node.get("config"), dict):
                found.append(node["config"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return found
