"""Checkpoint files of torch_impl: the neutral directory of `shared.weights` and a native ``.pt``.

Two formats, told apart by the path:

* a **directory** (any path not ending in ``.pt`` or ``.pth``): ``config.json`` + ``model.safetensors``, the
  framework-neutral checkpoint of `shared.weights`, which tf_impl reads too;
* a **``.pt`` file** (or ``.pth``): ``torch.save`` of a plain dict that
  ``torch.load(weights_only=True)`` accepts::

      {"format": "twin-transformer/torch_impl", "format_version": 1,
       "config": "<TransformerConfig as JSON>", "state_dict": {name: tensor}}

  ``state_dict`` is exactly ``model.state_dict()`` of a `torch_impl.Transformer` (torch names and
  layouts: ``nn.Linear`` weights ``(out, in)``; with shared embeddings both names are present), so a
  plain PyTorch user can also ``model.load_state_dict(torch.load(f, weights_only=True)["state_dict"])``.
  A ``.pt`` holding a bare state dict (``torch.save(model.state_dict(), f)``) is read too, given
  the config.

Loading never unpickles anything but tensors and plain containers: every ``.pt`` goes through
``torch.load(path, weights_only=True, map_location="cpu")``, so a pickle that would run code is
refused, not executed. Everything is checked before a model is touched (keys, shapes, dtype = the
config's, finite values, the format version): one error names the file and lists every problem,
and a model being loaded into keeps its weights. NaN/Inf weights are refused unless
``allow_nonfinite=True`` (to inspect, e.g., a diverged run); saving always refuses them.

Saving is atomic: the file (or directory) is written under a temporary name in the same folder,
fsynced, and renamed into place with ``os.replace``; a failure leaves the old file or none.

This module provides only the ``.pt`` half (`PT`, registered beside `shared.checkpoints.NEUTRAL` in
`FORMATS`); the per-tensor checks are `shared.checkpoints`', and choosing a format from the path
(or ``format=``) is `shared.formats`' (``read_for_backend``, ``destination``), so the model-level
functions read and write every format of its registry. They have the same names and signatures in
tf_impl:
`load_checkpoint`, `save_checkpoint`, `load_into`, `read_checkpoint`, `write_checkpoint`.
"""
from __future__ import annotations

import functools
import os
import pickle
import re
import warnings
import zipfile
from collections import Counter
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from shared import TransformerConfig
from shared import formats
from shared.checkpoints import NEUTRAL, CheckpointFormat, Slot, Stored, read_stored
from shared.checks import check_config
from shared.paths import check_path, check_source
from shared.importers.notes import note_widened
from shared.weights import WeightsError, check_fits, check_weights, config_mismatch, write_atomically

from . import weights_io
from .model import Transformer, check_model

PT_SUFFIX = ".pt"
PT_SUFFIXES = (".pt", ".pth")  # both are PyTorch's conventions
PT_FORMAT = "twin-transformer/torch_impl"
PT_FORMAT_VERSION = 1
PT_KEYS = ("format", "format_version", "config", "state_dict")
_LISTED = 30  # names listed per problem
OWNER = "torch_impl"


# -- the state-dict layout ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def native_layout(config: TransformerConfig) -> dict[str, Slot]:
    """``{torch state_dict key: Slot(canonical name, torch shape, dtype, transposed?)}`` in
    state_dict order.

    Derived from a model built on the ``meta`` device (no memory, no compute). Tied parameters
    appear under every key that ``state_dict()`` lists (e.g. both embeddings when shared).
    Cached per config: treat the result as read-only."""
    try:
        with torch.device("meta"):
            model = Transformer(config)
    except (RuntimeError, NotImplementedError):  # an op without a meta kernel: build it for real
        model = Transformer(config)
    canonical = {id(param): (name, transposed)
                 for name, (param, transposed) in weights_io.weight_table(model).items()}
    layout = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in canonical:  # the module tree and the schema must never drift
            raise AssertionError(f"torch_impl.checkpoints: state_dict key {key!r} has no canonical name")
        name, transposed = canonical[id(value)]
        layout[key] = Slot(name, tuple(value.shape), config.dtype, transposed)
    return layout


def to_state_dict(config: TransformerConfig, weights: Mapping[str, np.ndarray],
                  source: str = "to_state_dict: weights") -> dict[str, torch.Tensor]:
    """Canonical weights -> ``Transformer(config).state_dict()`` layout (CPU tensors; a tied
    parameter is one tensor under each of its keys, as ``state_dict()`` gives it). ``source``:
    how an error names the weights (the caller's own name)."""
    weights = check_weights(config, weights, source=source)  # read once: use the copies
    tensors: dict[str, torch.Tensor] = {}
    out = {}
    for key, slot in native_layout(config).items():
        if slot.name not in tensors:
            value = np.asarray(weights[slot.name])
            tensors[slot.name] = torch.from_numpy(
                np.ascontiguousarray(value.T if slot.transposed else value).copy())
        out[key] = tensors[slot.name]
    return out


def from_state_dict(config: TransformerConfig, state_dict: Mapping, source: str = "state_dict",
                    allow_nonfinite: bool = False) -> dict[str, np.ndarray]:
    """A torch_impl state dict -> canonical weights, everything checked first: one `WeightsError`
    (naming ``source``) lists every missing, unexpected, non-tensor, mis-shaped, mis-typed or
    non-finite entry, and tied keys that disagree (`shared.checkpoints.read_stored`; what only
    torch can get wrong, a non-tensor or a sparse one, is found here). Returns copies."""
    if not isinstance(state_dict, Mapping):
        raise WeightsError(source, ["expected a state dict (name -> tensor), "
                                    f"got {type(state_dict).__name__}"])
    problems: list[str] = []
    odd = [k for k in state_dict if not isinstance(k, str)]
    if odd:
        problems.append(f"keys expected str, got {odd[:_LISTED]!r}")
    stored = {key: _stored(value) for key, value in state_dict.items() if isinstance(key, str)}
    tensors = [s for s in stored.values() if isinstance(s, Stored)]  # values: where all are tensors
    check_fits(config, len(stored), sum(int(np.prod(s.shape)) for s in tensors)
               if len(tensors) == len(stored) else None, source, "keys")
    return read_stored(config, native_layout(config), stored, source, allow_nonfinite,
                       what="keys", problems=problems)


def _stored_values(tensor) -> int:
    """How many values ``tensor``'s storage holds: fewer than its elements for an expanded view
    (stride 0), which a copy would blow up (2 * 10**9 elements from one stored float)."""
    return tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)


def _shown(value) -> str:
    """A stored field's value for a message: its repr where it is a short plain value, else its
    type (a tensor's repr may be its every element)."""
    if isinstance(value, (str, int, float, type(None))) and len(repr(value)) <= 80:
        return repr(value)
    return f"a {type(value).__name__}"


def _stored(value) -> Stored | str:
    """One state-dict entry as `read_stored` checks it, or why it cannot be one."""
    if not isinstance(value, torch.Tensor):
        return f"expected a tensor, got {type(value).__name__}"
    if value.layout != torch.strided or value.is_quantized:
        return f"expected a dense tensor, got layout {value.layout}"
    if value.is_meta:  # a shape without values (torch.device("meta"))
        return "expected a tensor with values, got one on the meta device"
    return Stored(tuple(value.shape), str(value.dtype).removeprefix("torch."),
                  lambda: value.detach().cpu().numpy())


# -- .pt files ------------------------------------------------------------------------------------
def torch_load(path: str | os.PathLike):
    """``torch.load(path, weights_only=True, map_location="cpu")`` with errors that name the file.

    Only a ``torch.save`` zip archive is read (PyTorch >= 1.6 writes nothing else). Anything in it
    but tensors, numbers, strings and plain containers is refused by the weights-only unpickler:
    it is never constructed, so no code in the file runs."""
    check_source(path, directory=False)  # a FIFO would block, /dev/zero read without end
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such file")
    if path.is_dir():
        raise ValueError(f"{str(path)!r}: is a directory, expected a {PT_SUFFIX} file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{str(path)!r}: not a PyTorch file (torch.save writes a zip archive; this "
                         "is not one: another format, or truncated)")
    # A damaged pickle can make torch warn on its way to refusing it (a tensor where the unpickler
    # expects a function: comparing it warns about `__torch_function__`): the refusal below says
    # all there is, so the warnings of a failed load are dropped, and a good load's are shown.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as err:
            text = str(err)
            if "Weights only load failed" not in text:
                raise ValueError(f"{str(path)!r}: not a readable PyTorch file ({text.splitlines()[0]})") from None
            # torch's detail ends at a sentence's end or a blank line; a value's repr in it can run
            # over several lines (a tensor's), which are joined, and a long one is cut.
            found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\. |\n\n|$)", text, re.DOTALL)
            why = " ".join(found.group(1).split()) if found else "objects other than tensors and plain containers"
            why = why if len(why) <= 200 else why[:197] + "..."
            raise ValueError(f"{str(path)!r}: refused: the pickle holds more than tensors and plain "
                             f"containers ({why}); it was not unpickled and none of its code ran") from None
        except Exception as err:  # corrupted zip members, bad records: torch raises RuntimeError & co.
            first = str(err).splitlines()[0] if str(err) else ""
            raise ValueError(f"{str(path)!r}: not a readable PyTorch file, corrupted or truncated "
                             f"({type(err).__name__}: {first})") from None
    for caught_one in caught:  # under the caller's filters, as torch.load's own would be
        warnings.warn_explicit(caught_one.message, caught_one.category, caught_one.filename,
                               caught_one.lineno, source=caught_one.source)
    return obj


def read_native(path: str | os.PathLike, config: TransformerConfig | None = None,
            allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and fully validate a ``.pt`` file; return ``(config, canonical weights)``.

    The file holds the config (the layout of `write_native`), or is a bare ``model.state_dict()``, in
    which case ``config`` is required. A ``config`` given for a file that holds one must equal it.
    """
    obj = torch_load(path)
    where = str(path)
    if isinstance(obj, Mapping) and any(k in obj for k in PT_KEYS):
        extra = sorted(str(k) for k in obj if k not in PT_KEYS)
        lacking = [k for k in PT_KEYS if k not in obj]
        if extra or lacking:
            raise ValueError(f"{where!r}: expected the keys {list(PT_KEYS)} of a torch_impl checkpoint, "
                             f"missing {lacking}, unexpected {extra}")
        # Compared only as the plain values they must be: a tensor here would compare element-wise.
        if type(obj["format"]) is not str or obj["format"] != PT_FORMAT:
            raise ValueError(f"{where!r}: expected format {PT_FORMAT!r}, got {_shown(obj['format'])}")
        if type(obj["format_version"]) is not int or obj["format_version"] != PT_FORMAT_VERSION:
            raise ValueError(f"{where!r}: unknown format_version {_shown(obj['format_version'])}, "
                             f"this version reads {PT_FORMAT_VERSION}")
        if not isinstance(obj["config"], str):
            raise ValueError(f"{where!r}: 'config' expected a JSON string, "
                             f"got {type(obj['config']).__name__}")
        try:
            stored = TransformerConfig.from_json(obj["config"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where!r}: invalid config: {err}") from None
        if config is not None and config != stored:
            raise ValueError(config_mismatch(where, config, stored))
        config, state_dict = stored, obj["state_dict"]
    elif isinstance(obj, Mapping):
        if config is None:
            raise ValueError(
                f"{where!r}: holds a bare state dict and no config: pass the config (config=..., "
                "--config FILE.json) of the torch_impl model that saved it; for a state dict of "
                "PyTorch's nn.Transformer tutorial or the Annotated Transformer, use the importers "
                "(twins convert --from nn-transformer / --from annotated)")
        state_dict = obj
    else:
        raise ValueError(f"{where!r}: expected a dict (a torch_impl checkpoint or a state dict), "
                         f"got {type(obj).__name__}")
    return config, from_state_dict(config, state_dict, source=where, allow_nonfinite=allow_nonfinite)


def write_native(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write canonical weights as a ``.pt`` (layout in the module docstring), atomically."""
    check_path(path)  # named, as every writer names it (Python's words named none)
    check_config(config)  # named before its to_json, as tf_impl's (a TypeError, not AttributeError)
    path = Path(path)
    payload = {"format": PT_FORMAT, "format_version": PT_FORMAT_VERSION, "config": config.to_json(),
               "state_dict": to_state_dict(config, weights, "write_native: weights")}  # checked, finite too

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: the archive's inner name does not vary with tmp
            torch.save(payload, f)

    write_atomically(path, write)
    return path


# The dtypes of another model's state dict that the importers take: half precision widened exactly.
_HALVES = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float32, torch.float64, *_HALVES)
_FOREIGN_DTYPES = "float32 and float64 (kept), float16 and bfloat16 (widened exactly to float32)"


def read_foreign_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A ``.pt`` holding a state dict of another model (for `shared.importers`), as NumPy arrays.

    Loaded with ``torch.load(weights_only=True)``; the file must hold a flat ``{name: tensor}``
    (what ``torch.save(model.state_dict(), path)`` writes) of floating-point tensors: float32 and
    float64 as they are, float16 and bfloat16 widened exactly to float32 (every such value is a
    float32 value; an `ImportNote` says so); any other dtype is refused, naming the file, the
    tensor, its dtype and what is supported."""
    obj = torch_load(path)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{str(path)!r}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    if obj.get("format") == PT_FORMAT:  # this project's own file: its tensors sit under "state_dict"
        raise ValueError(f"{str(path)!r}: expected a state dict of another model, got a torch_impl "
                         "checkpoint; read it as one (twins convert --from torch, format='torch')")
    problems = [f"{k!r}: expected a tensor, got {type(v).__name__}"
                for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    dense = {k: v for k, v in tensors.items() if v.layout == torch.strided and not v.is_quantized}
    problems += [f"{k!r}: expected a dense tensor, got {v.layout}{' quantized' if v.is_quantized else ''}"
                 for k, v in tensors.items() if k not in dense]
    problems += [f"{k!r}: expected a tensor with values, got one on the meta device"
                 for k, v in dense.items() if v.is_meta]
    # Only a dense tensor has a storage to measure (a sparse one's raises NotImplementedError).
    problems += [f"{k!r}: expected a tensor that stores each of its values, got {v.numel():,} values "
                 f"over {_stored_values(v):,} stored (an expanded view)"
                 for k, v in dense.items() if not v.is_meta and _stored_values(v) < v.numel()]
    problems += [f"{k!r}: dtype {str(v.dtype).removeprefix('torch.')} is not supported (supported: "
                 f"{_FOREIGN_DTYPES})" for k, v in dense.items() if v.dtype not in _FLOATS]
    if problems:
        raise WeightsError(str(path), problems)
    widened = Counter(str(v.dtype).removeprefix("torch.") for v in tensors.values() if v.dtype in _HALVES)
    for dtype, count in widened.items():
        note_widened(path, dtype, count)
    return {k: (v.float() if v.dtype in _HALVES else v).detach().cpu().numpy().copy()
            for k, v in tensors.items()}


PT = CheckpointFormat("torch", PT_SUFFIXES, read_native, write_native, f"a {PT_SUFFIX} file")
FORMATS = (NEUTRAL, PT)  # what torch_impl reads and writes; the path chooses (shared.checkpoints)


# -- the model-level functions (the same names and signatures in tf_impl) -------------------------
def read_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False, format: str | None = None, **options
                    ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` of ``path`` in any format `shared.formats` reads, fully
    validated: a .pt file or a neutral directory here, any other through `shared.formats.read`
    (``format``: its name, which decides over the path; ``options``: that format's own, e.g.
    ``n_heads=`` for a foreign state dict). ``config`` only for a native file that holds none."""
    return formats.read_for_backend(path, FORMATS, OWNER, config, allow_nonfinite, format, **options)


def write_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                     weights: Mapping[str, np.ndarray], format: str | None = None, **options) -> Path:
    """Write ``weights`` and ``config`` to ``path``, atomically, in the format ``format`` names or
    the path says (`shared.formats.destination`): ``*.pt``/``*.pth`` a torch_impl file, a new
    path without a suffix (or a directory) a neutral directory, ``*.weights.h5`` tf_impl's file
    (where TensorFlow is installed), and any other writable format of `shared.formats` by name
    (``format="onnx"``, ``"ctranslate2"``, ``"marian"``, ...) with its own ``options``. A path no
    format claims is refused: name the format."""
    formats.write(formats.destination(path, format), config, weights, path, **options)
    return Path(path)


def load_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False, format: str | None = None, **options) -> Transformer:
    """A new `Transformer` (eval mode) from a checkpoint in any format `shared.formats` reads (a
    neutral directory, a ``.pt``, a ``.weights.h5``, a Marian directory, ...; `read_checkpoint`), fully
    checked first (one error naming the file lists every problem). ``config`` only for a ``.pt``
    that holds a bare state dict; ``allow_nonfinite`` accepts NaN/Inf weights (refused by default)."""
    config, weights = read_checkpoint(path, config, allow_nonfinite, format, **options)
    model = Transformer(config)
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)
    return model.eval()


def save_checkpoint(model: Transformer, path: str | os.PathLike, format: str | None = None,
                    **options) -> Path:
    """``model``'s weights and config, atomically, in the format of `write_checkpoint`: ``*.pt``
    a ``torch.save`` file (``torch.load(weights_only=True)`` reads it), a path without a suffix a
    neutral directory, ``*.weights.h5`` tf_impl's file; ``format`` (and its ``options``) for any
    other format `shared.formats` writes."""
    check_model(model)
    fmt = formats.destination(path, format)  # before the export: a bad path costs nothing
    # the model's weights checked here, in tf_impl's words, whatever the format's writer says
    weights = check_weights(model.config, model.export_weights(), source="save_checkpoint: weights")
    formats.write(fmt, model.config, weights, path, **options)
    return Path(path)


def load_into(model: Transformer, path: str | os.PathLike, allow_nonfinite: bool = False) -> None:
    """Load a checkpoint into an existing model. The file is read and checked completely, and its
    config must equal ``model.config``, before any parameter is written: on error the model keeps
    its weights. (A ``.pt`` holding a bare state dict is read with ``model.config``.)"""
    check_model(model)
    weights = formats.read_for_model(path, model.config, FORMATS, OWNER, allow_nonfinite)
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)


__all__ = ["load_checkpoint", "save_checkpoint", "load_into", "read_checkpoint", "write_checkpoint",
           "PT", "FORMATS", "read_native", "write_native", "torch_load", "read_foreign_state_dict",
           "native_layout", "to_state_dict", "from_state_dict", "PT_FORMAT", "PT_FORMAT_VERSION"]
