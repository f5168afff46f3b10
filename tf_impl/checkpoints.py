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

This module provides only the ``.weights.h5`` half (`H5`, registered beside
`shared.checkpoints.NEUTRAL` in `FORMATS`); the per-tensor checks are `shared.checkpoints`', and
choosing a format from the path (or ``format=``) is `shared.formats`' (``read_for_backend``,
``destination``), so the model-level functions read and write every format of its registry. They
have the same names and signatures in torch_impl: `load_checkpoint`, `save_checkpoint`,
`load_into`, `read_checkpoint`, `write_checkpoint`.
"""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Mapping

import h5py
import numpy as np

from shared import TransformerConfig
from shared import formats
from shared.checkpoints import NEUTRAL, CheckpointFormat, Slot, Stored, read_stored
from shared.paths import check_path, check_source
from shared.weights import check_fits, check_weights, config_mismatch, write_atomically

from . import weights_io
from .model import Transformer, check_model

H5_SUFFIX = ".weights.h5"
H5_FORMAT = "twin-transformer/tf_impl"
H5_FORMAT_VERSION = 1
ATTR_FORMAT = "twin_transformer.format"
ATTR_VERSION = "twin_transformer.format_version"
ATTR_CONFIG = "twin_transformer.config"
_MARKER = 2.0 ** 20  # marker values 2^20 + i are exact in float32 and float64
OWNER = "tf_impl"


# -- the Keras file layout ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def native_layout(config: TransformerConfig) -> dict[str, Slot]:
    """``{dataset path: Slot(canonical name or None, shape, dtype)}`` of what ``save_weights``
    writes for ``Transformer(config)``. A name of ``None`` marks a dataset that is not a weight
    (none today; Keras state such as seed generators would be one): it must be present, its value
    is not used. Cached per config: treat the result as read-only."""
    model = Transformer(config)
    table = weights_io.weight_table(model)
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
                layout[path] = Slot(name, tuple(ds.shape), ds.dtype.name)
    found = {slot.name for slot in layout.values()} - {None}
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
def read_native(path: str | os.PathLike, config: TransformerConfig | None = None,
            allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and fully validate a ``.weights.h5`` file; return ``(config, canonical weights)``.

    The config is the one stored in the file; for a file written by plain Keras (none stored) it
    must be given. A ``config`` given for a file that stores one must equal it."""
    check_source(path, directory=False)  # a FIFO would block, /dev/zero read without end
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
            stored = {p: Stored(tuple(ds.shape), ds.dtype.name, lambda ds=ds: ds[...])
                      for p, ds in _datasets(handle).items()}
            check_fits(config, len(stored), sum(int(np.prod(s.shape)) for s in stored.values()), where,
                       "datasets")
            layout = native_layout(config)
            return config, read_stored(config, layout, stored, where, allow_nonfinite,
                                       what="datasets", label=lambda p: _labelled(p, layout))
        except (OSError, RuntimeError, KeyError) as err:  # h5py on damaged data
            raise ValueError(f"{where!r}: a damaged HDF5 file ({type(err).__name__}: {err})") from None


def _attr(handle: h5py.File, name: str):
    value = handle.attrs[name]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):  # an array attribute: compared and reported as a list (an
        value = value.tolist()          # array's == is elementwise, and `if` on it raises)
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
        raise ValueError(config_mismatch(where, config, stored))
    return stored


def _labelled(path: str, layout) -> str:
    name = layout[path].name
    return f"{path} ({name})" if name else path


def write_native(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write canonical weights as a ``.weights.h5`` (Keras layout + the config), atomically."""
    check_path(path)  # named, as every writer names it (Python's words named none)
    weights = check_weights(config, weights, source="write_native: weights")  # read once: use the copies
    model = Transformer(config)
    model.import_weights(weights)
    return _save_model_h5(model, Path(path))


def _save_model_h5(model: "Transformer", path: Path) -> Path:
    """``model`` as a Keras weights file at ``path``, whatever its name (a name without the suffix
    is written when the format is named, as torch_impl writes a ``.pt`` under any name)."""
    def write(tmp: str) -> None:
        model.save_weights(tmp)
        with h5py.File(tmp, "r+") as f:
            f.attrs[ATTR_FORMAT] = H5_FORMAT
            f.attrs[ATTR_VERSION] = H5_FORMAT_VERSION
            f.attrs[ATTR_CONFIG] = model.config.to_json()

    write_atomically(path, write, suffix=H5_SUFFIX)  # Keras insists on the suffix: the temporary has it
    return path


H5 = CheckpointFormat("tf", (H5_SUFFIX,), read_native, write_native, f"a {H5_SUFFIX} file")
FORMATS = (NEUTRAL, H5)  # what tf_impl reads and writes; the path chooses (shared.checkpoints)


# -- the model-level functions (the same names and signatures in torch_impl) ----------------------
def read_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False, format: str | None = None, **options
                    ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` of ``path`` in any format `shared.formats` reads, fully
    validated: a .weights.h5 file or a neutral directory here, any other through `shared.formats.read`
    (``format``: its name, which decides over the path; ``options``: that format's own, e.g.
    ``n_heads=`` for a foreign state dict). ``config`` only for a native file that holds none."""
    return formats.read_for_backend(path, FORMATS, OWNER, config, allow_nonfinite, format, **options)


def write_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                     weights: Mapping[str, np.ndarray], format: str | None = None, **options) -> Path:
    """Write ``weights`` and ``config`` to ``path``, atomically, in the format ``format`` names or
    the path says (`shared.formats.destination`): ``*.weights.h5`` a tf_impl file, a new path
    without a suffix (or a directory) a neutral directory, ``*.pt`` torch_impl's file (where torch
    is installed), and any other writable format of `shared.formats` by name (``format="onnx"``,
    ``"ctranslate2"``, ``"marian"``, ...) with its own ``options``. A path no format claims is
    refused: name the format."""
    formats.write(formats.destination(path, format), config, weights, path, **options)
    return Path(path)


def load_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False, format: str | None = None, **options) -> Transformer:
    """A new `Transformer` from a checkpoint in any format `shared.formats` reads (a neutral
    directory, a ``.weights.h5``, a ``.pt``, a Marian directory, ...; `read_checkpoint`), fully
    checked first (one error naming the file lists every problem). ``config`` only for a
    ``.weights.h5`` written by plain Keras ``save_weights``; ``allow_nonfinite`` accepts NaN/Inf
    weights (refused by default)."""
    config, weights = read_checkpoint(path, config, allow_nonfinite, format, **options)
    model = Transformer(config)
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)
    return model


def save_checkpoint(model: Transformer, path: str | os.PathLike, format: str | None = None,
                    **options) -> Path:
    """``model``'s weights and config, atomically, in the format of `write_checkpoint`:
    ``*.weights.h5`` Keras' ``save_weights`` file with the config inside it, a path without a
    suffix a neutral directory, ``*.pt`` torch_impl's file; ``format`` (and its ``options``) for
    any other format `shared.formats` writes."""
    check_model(model)
    fmt = formats.destination(path, format)  # before the export: a bad path costs nothing
    # the model's weights checked here, in torch_impl's words, whatever the format's writer says
    weights = check_weights(model.config, model.export_weights(), source="save_checkpoint: weights")
    if fmt.name == H5.name and not options:  # the model's own variables: no second model
        return _save_model_h5(model, Path(path))
    formats.write(fmt, model.config, weights, path, **options)
    return Path(path)


def load_into(model: Transformer, path: str | os.PathLike, allow_nonfinite: bool = False) -> None:
    """Load a checkpoint into an existing model. The file is read and checked completely, and its
    config must equal ``model.config``, before any variable is written: on error the model keeps
    its weights. (A plain-Keras ``.weights.h5`` is read with ``model.config``.)"""
    check_model(model)
    weights = formats.read_for_model(path, model.config, FORMATS, OWNER, allow_nonfinite)
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)


__all__ = ["load_checkpoint", "save_checkpoint", "load_into", "read_checkpoint", "write_checkpoint",
           "H5", "FORMATS", "read_native", "write_native", "native_layout", "H5_FORMAT", "H5_FORMAT_VERSION"]
