"""Checkpoint files of tf_impl: the neutral directory of `shared.weights` and a native ``.weights.h5``.

Two formats, told apart by the path:

* a **directory** (any path not ending in ``.weights.h5``): ``config.json`` + ``model.safetensors``,
  the framework-neutral checkpoint of `shared.weights`, which torch_impl reads too;
* a **``.weights.h5`` file**: what Keras' ``model.save_weights`` writes for a `tf_impl.Transformer`
  (so plain Keras reads it back with ``model.load_weights``), with the config stored **in the same
  file**, as HDF5 attributes of its root group::

      twin_transformer.format          "twin-transformer/tf_impl"
      twin_transformer.format_version  1
      twin_transformer.config          "<TransformerConfig as JSON>"

  Keras weights files hold no config; a sidecar ``.json`` beside it could be lost, renamed or
  overwritten separately, so the config travels inside the one file and is written in the same
  atomic step. Keras ignores the attributes. A ``.weights.h5`` written by plain Keras
  ``save_weights`` (no attributes) is read too, given the config (``config=``, ``--config``).

Reading does not go through ``load_weights``, which casts a float64 file into float32 variables
without a word and skips what does not match: the file is read with h5py and compared with the
layout Keras writes for the config (every dataset path, shape and dtype; the canonical name of
each is learned once per config by saving a model whose variables hold distinct marker values).
Everything is checked before a model is touched: one error names the file and lists every problem,
and a model being loaded into keeps its weights. NaN/Inf weights are refused unless
``allow_nonfinite=True``; saving always refuses them.

Saving is atomic: written under a temporary name in the same folder, fsynced, then ``os.replace``.
"""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import h5py
import numpy as np

from shared import TransformerConfig
from shared import weights as neutral
from shared.weights import WeightsError, check_weights, config_differences, write_atomically

from . import weights_io

if TYPE_CHECKING:
    from .model import Transformer

H5_SUFFIX = ".weights.h5"
H5_FORMAT = "twin-transformer/tf_impl"
H5_FORMAT_VERSION = 1
ATTR_FORMAT = "twin_transformer.format"
ATTR_VERSION = "twin_transformer.format_version"
ATTR_CONFIG = "twin_transformer.config"
_MARKER = 2.0 ** 20  # marker values 2^20 + i are exact in float32 and float64
_LISTED = 30


# -- the Keras file layout ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def h5_layout(config: TransformerConfig) -> dict[str, tuple[str | None, tuple[int, ...], str]]:
    """``{dataset path: (canonical name or None, shape, dtype)}`` of what ``save_weights`` writes
    for ``Transformer(config)``. ``None`` marks a dataset that is not a weight (none today; Keras
    state such as seed generators would be one): it must be present, its value is not used."""
    from .model import Transformer
    model = Transformer(config)
    table = weights_io.variable_table(model)
    for i, variable in enumerate(table.values()):
        variable.assign(np.full(variable.shape, _MARKER + i, dtype=config.dtype))
    names = list(table)
    layout = {}
    with tempfile.TemporaryDirectory(prefix="tf_impl_layout_") as folder:
        file = os.path.join(folder, "layout" + H5_SUFFIX)
        model.save_weights(file)
        with h5py.File(file, "r") as handle:
            for path, ds in _datasets(handle).items():
                value = ds[...]
                name = None
                if ds.dtype == np.dtype(config.dtype) and value.size and (value == value.flat[0]).all():
                    index = float(value.flat[0]) - _MARKER
                    if index == int(index) and 0 <= index < len(names):
                        name = names[int(index)]
                layout[path] = (name, tuple(ds.shape), ds.dtype.name)
    found = {name for name, _, _ in layout.values()} - {None}
    if found != set(names):  # every canonical weight must be somewhere in the file
        raise AssertionError(f"tf_impl.checkpoints: weights not found in the Keras file: "
                             f"{sorted(set(names) - found)}")
    return layout


def _datasets(handle: h5py.File) -> dict[str, h5py.Dataset]:
    """Every dataset of the file by path, in the order h5py visits them."""
    out: dict[str, h5py.Dataset] = {}
    handle.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


# -- .weights.h5 files ----------------------------------------------------------------------------
def read_h5(path: str | os.PathLike, config: TransformerConfig | None = None,
            allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and fully validate a ``.weights.h5`` file; return ``(config, canonical weights)``.

    The config is the one stored in the file; for a file written by plain Keras (none stored) it
    must be given. A ``config`` given for a file that stores one must equal it."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise FileNotFoundError(f"{where!r}: no such file")
    if path.is_dir():
        raise ValueError(f"{where!r}: is a directory, expected a {H5_SUFFIX} file")
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise ValueError(f"{where!r}: not a readable HDF5 file, another format or truncated "
                         f"({err})") from None
    with handle:
        try:
            config = _config_of(handle, where, config)
            problems: list[str] = []
            arrays = _read_datasets(handle, h5_layout(config), problems, allow_nonfinite)
        except (OSError, RuntimeError, KeyError) as err:  # h5py on damaged data
            raise ValueError(f"{where!r}: a damaged HDF5 file ({type(err).__name__}: {err})") from None
    if problems:
        raise WeightsError(where, problems)
    check_weights(config, arrays, source=where, allow_nonfinite=allow_nonfinite)  # invariant
    return config, {name: arrays[name] for name in neutral.weight_schema(config)}  # schema order


def _attr(handle: h5py.File, name: str):
    value = handle.attrs[name]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _config_of(handle: h5py.File, where: str, config: TransformerConfig | None) -> TransformerConfig:
    ours = [a for a in (ATTR_FORMAT, ATTR_VERSION, ATTR_CONFIG) if a in handle.attrs]
    if not ours:
        if config is None:
            raise ValueError(f"{where!r}: holds no config (a Keras weights file written by plain "
                             "save_weights?): pass the config (config=..., --config FILE.json) of "
                             "the tf_impl model that saved it")
        return config
    lacking = [a for a in (ATTR_FORMAT, ATTR_VERSION, ATTR_CONFIG) if a not in handle.attrs]
    if lacking:
        raise ValueError(f"{where!r}: missing the attributes {lacking} of a tf_impl checkpoint")
    if _attr(handle, ATTR_FORMAT) != H5_FORMAT:
        raise ValueError(f"{where!r}: expected format {H5_FORMAT!r}, got {_attr(handle, ATTR_FORMAT)!r}")
    version = _attr(handle, ATTR_VERSION)
    if version != H5_FORMAT_VERSION:
        raise ValueError(f"{where!r}: unknown format_version {version!r}, this version reads "
                         f"{H5_FORMAT_VERSION}")
    text = _attr(handle, ATTR_CONFIG)
    try:
        stored = TransformerConfig.from_json(text) if isinstance(text, str) else None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where!r}: invalid config: {err}") from None
    if stored is None:
        raise ValueError(f"{where!r}: attribute {ATTR_CONFIG} expected a JSON string, "
                         f"got {type(text).__name__}")
    if config is not None and config != stored:
        raise ValueError(f"{where!r}: the config given (the model's, or --config) differs from the one "
                         f"in the file in {config_differences(config, stored)}")
    return stored


def _read_datasets(handle: h5py.File, layout, problems: list[str], allow_nonfinite: bool
                   ) -> dict[str, np.ndarray]:
    present = _datasets(handle)
    missing = [p for p in layout if p not in present]
    unexpected = sorted(p for p in present if p not in layout)
    if missing:
        problems.append(f"missing datasets: {_names(_labelled(p, layout) for p in missing)}")
    if unexpected:
        problems.append(f"unexpected datasets: {_names(unexpected)}")
    arrays: dict[str, np.ndarray] = {}
    firsts: dict[str, str] = {}
    for p, (name, shape, dtype) in layout.items():
        if p not in present:
            continue
        ds, label, ok = present[p], _labelled(p, layout), True
        if tuple(ds.shape) != shape:
            problems.append(f"{label}: expected shape {shape} (from the config), got {tuple(ds.shape)}")
            ok = False
        if ds.dtype.name != dtype:
            problems.append(f"{label}: expected dtype {dtype} (the config's), got {ds.dtype}")
            ok = False
        if not ok or name is None:
            continue
        array = np.array(ds[...], dtype=dtype, order="C", copy=True)
        if not allow_nonfinite and not np.isfinite(array).all():
            problems.append(f"{label}: contains NaN or Inf")
        if name in arrays:  # one weight written twice (a tied layer): both copies must agree
            if arrays[name].tobytes() != array.tobytes():
                problems.append(f"{label}: expected the same values as {firsts[name]} (one tied weight), "
                                "got different ones")
            continue
        arrays[name], firsts[name] = array, p
    return arrays


def _labelled(path: str, layout) -> str:
    name = layout[path][0]
    return f"{path} ({name})" if name else path


def _names(items) -> str:
    items = list(items)
    more = f" ... and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return f"{items[:_LISTED]}{more}"


def save_h5(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write canonical weights as a ``.weights.h5`` (Keras layout + the config), atomically."""
    from .model import Transformer
    check_weights(config, weights, source="save_h5: weights")
    model = Transformer(config)
    model.import_weights(weights)
    return _save_model_h5(model, Path(path))


def _save_model_h5(model: "Transformer", path: Path) -> Path:
    if not path.name.endswith(H5_SUFFIX):
        raise ValueError(f"{str(path)!r}: expected a path ending in {H5_SUFFIX}")

    def write(tmp: str) -> None:
        model.save_weights(tmp)
        with h5py.File(tmp, "r+") as f:
            f.attrs[ATTR_FORMAT] = H5_FORMAT
            f.attrs[ATTR_VERSION] = H5_FORMAT_VERSION
            f.attrs[ATTR_CONFIG] = model.config.to_json()

    write_atomically(path, write, suffix=H5_SUFFIX)  # Keras insists on the suffix
    return path


# -- both formats ---------------------------------------------------------------------------------
def is_h5(path: str | os.PathLike) -> bool:
    return Path(path).name.endswith(H5_SUFFIX)


def read_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` from a ``.weights.h5`` file or a neutral checkpoint
    directory, fully validated (``config`` only for a ``.weights.h5`` written by plain Keras)."""
    if is_h5(path):
        return read_h5(path, config, allow_nonfinite)
    _refuse_other_files(path)
    if config is not None:
        raise ValueError(f"{str(path)!r}: a neutral checkpoint holds its config; do not pass one")
    return neutral.load_checkpoint(path, allow_nonfinite=allow_nonfinite)


def write_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                     weights: Mapping[str, np.ndarray]) -> Path:
    """Write a ``.weights.h5`` file or (any other path) a neutral checkpoint directory, atomically."""
    if is_h5(path):
        return save_h5(path, config, weights)
    _refuse_other_files(path)
    return neutral.save_checkpoint(path, config, weights)


def load_model(path: str | os.PathLike, config: TransformerConfig | None = None,
               allow_nonfinite: bool = False) -> "Transformer":
    """A new `Transformer` with the weights of a ``.weights.h5`` or a neutral directory."""
    from .model import Transformer
    config, weights = read_checkpoint(path, config, allow_nonfinite)
    model = Transformer(config)
    _import(model, weights, allow_nonfinite)
    return model


def load_into(model: "Transformer", path: str | os.PathLike, allow_nonfinite: bool = False) -> None:
    """Load a checkpoint into an existing model. The file is read and checked completely, and its
    config must equal ``model.config``, before any variable is written: on error the model keeps
    its weights. (A plain-Keras ``.weights.h5`` is read with ``model.config``.)"""
    if is_h5(path):
        config, weights = read_h5(path, model.config, allow_nonfinite)
    else:
        config, weights = read_checkpoint(path, None, allow_nonfinite)
    if config != model.config:
        raise ValueError(f"{str(path)!r}: the checkpoint's config differs from the model's in "
                         f"{config_differences(model.config, config)}")
    _import(model, weights, allow_nonfinite)


def save_model(model: "Transformer", path: str | os.PathLike) -> Path:
    """``model``'s weights and config as a ``.weights.h5`` or (any other path) a neutral directory."""
    if is_h5(path):
        check_weights(model.config, model.export_weights(), source="save_checkpoint: weights")
        return _save_model_h5(model, Path(path))
    return write_checkpoint(path, model.config, model.export_weights())



# -- helpers --------------------------------------------------------------------------------------
def _import(model: "Transformer", weights: Mapping[str, np.ndarray], allow_nonfinite: bool) -> None:
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)


def _refuse_other_files(path) -> None:
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{str(path)!r}: tf_impl reads and writes a neutral checkpoint directory "
                         f"or a {H5_SUFFIX} file; this is neither (a torch_impl .pt converts with "
                         "`twins convert`)")



__all__ = ["read_checkpoint", "write_checkpoint", "load_model", "load_into", "save_model", "read_h5",
           "save_h5", "h5_layout", "H5_FORMAT", "H5_FORMAT_VERSION"]
