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
"""
from __future__ import annotations

import functools
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np
import torch

from shared import TransformerConfig
from shared import weights as neutral
from shared.weights import WeightsError, check_weights, config_differences, write_atomically

from . import weights_io

if TYPE_CHECKING:
    from .model import Transformer

PT_SUFFIX = ".pt"
PT_SUFFIXES = (".pt", ".pth")  # both are PyTorch's conventions
PT_FORMAT = "twin-transformer/torch_impl"
PT_FORMAT_VERSION = 1
PT_KEYS = ("format", "format_version", "config", "state_dict")
_LISTED = 30  # names listed per problem


# -- the state-dict layout ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def state_dict_layout(config: TransformerConfig) -> dict[str, tuple[str, bool, tuple[int, ...]]]:
    """``{torch state_dict key: (canonical name, transposed?, torch shape)}`` in state_dict order.

    Derived from a model built on the ``meta`` device (no memory, no compute). Tied parameters
    appear under every key that ``state_dict()`` lists (e.g. both embeddings when shared).
    Cached per config: treat the result as read-only."""
    from .model import Transformer
    try:
        with torch.device("meta"):
            model = Transformer(config)
    except (RuntimeError, NotImplementedError):  # an op without a meta kernel: build it for real
        model = Transformer(config)
    canonical = {id(param): (name, transposed)
                 for name, (param, transposed) in weights_io.parameter_table(model).items()}
    layout = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in canonical:  # the module tree and the schema must never drift
            raise AssertionError(f"torch_impl.checkpoints: state_dict key {key!r} has no canonical name")
        name, transposed = canonical[id(value)]
        layout[key] = (name, transposed, tuple(value.shape))
    return layout


def to_state_dict(config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Canonical weights -> ``Transformer(config).state_dict()`` layout (CPU tensors; a tied
    parameter is one tensor under each of its keys, as ``state_dict()`` gives it)."""
    check_weights(config, weights, source="to_state_dict: weights")
    tensors: dict[str, torch.Tensor] = {}
    out = {}
    for key, (name, transposed, _) in state_dict_layout(config).items():
        if name not in tensors:
            value = np.asarray(weights[name])
            tensors[name] = torch.from_numpy(np.ascontiguousarray(value.T if transposed else value).copy())
        out[key] = tensors[name]
    return out


def from_state_dict(config: TransformerConfig, state_dict: Mapping, source: str = "state_dict",
                    allow_nonfinite: bool = False) -> dict[str, np.ndarray]:
    """A torch_impl state dict -> canonical weights, everything checked first: one `WeightsError`
    (naming ``source``) lists every missing, unexpected, non-tensor, mis-shaped, mis-typed or
    non-finite entry, and tied keys that disagree. Returns copies (never views of the tensors)."""
    if not isinstance(state_dict, Mapping):
        raise WeightsError(source, ["expected a state dict (name -> tensor), "
                                    f"got {type(state_dict).__name__}"])
    layout = state_dict_layout(config)
    problems: list[str] = []
    odd = [k for k in state_dict if not isinstance(k, str)]
    if odd:
        problems.append(f"keys expected str, got {odd[:_LISTED]!r}")
    missing = [k for k in layout if k not in state_dict]
    unexpected = sorted(k for k in state_dict if isinstance(k, str) and k not in layout)
    if missing:
        problems.append(f"missing keys: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_names(unexpected)}")
    dtype = getattr(torch, config.dtype)
    arrays: dict[str, np.ndarray] = {}
    for key, (name, transposed, shape) in layout.items():
        if key not in state_dict:
            continue
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            problems.append(f"{key}: expected a tensor, got {type(value).__name__}")
            continue
        if value.layout != torch.strided or value.is_quantized:
            problems.append(f"{key}: expected a dense tensor, got layout {value.layout}")
            continue
        ok = True
        if tuple(value.shape) != shape:
            problems.append(f"{key}: expected shape {shape} (from the config), got {tuple(value.shape)}")
            ok = False
        if value.dtype != dtype:
            problems.append(f"{key}: expected dtype {config.dtype} (the config's), "
                            f"got {str(value.dtype).removeprefix('torch.')}")
            ok = False
        if not ok:
            continue
        array = value.detach().cpu().numpy()
        if not allow_nonfinite and not np.isfinite(array).all():
            problems.append(f"{key}: contains NaN or Inf")
        array = np.array(array.T if transposed else array, order="C", copy=True)
        if name in arrays:  # a tied parameter listed twice: both keys must hold the same tensor
            if arrays[name].tobytes() != array.tobytes():
                first = next(k for k, v in layout.items() if v[0] == name)
                problems.append(f"{key}: expected the same values as {first} (one tied parameter), "
                                "got different ones")
            continue
        arrays[name] = array
    if problems:
        raise WeightsError(source, problems)
    check_weights(config, arrays, source=source, allow_nonfinite=allow_nonfinite)  # invariant
    return {name: arrays[name] for name in neutral.weight_schema(config)}  # schema order


def _names(keys) -> str:
    keys = list(keys)
    more = f" ... and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
    return f"{keys[:_LISTED]}{more}"


# -- .pt files ------------------------------------------------------------------------------------
def torch_load(path: str | os.PathLike):
    """``torch.load(path, weights_only=True, map_location="cpu")`` with errors that name the file.

    Only a ``torch.save`` zip archive is read (PyTorch >= 1.6 writes nothing else). Anything in it
    but tensors, numbers, strings and plain containers is refused by the weights-only unpickler:
    it is never constructed, so no code in the file runs."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such file")
    if path.is_dir():
        raise ValueError(f"{str(path)!r}: is a directory, expected a {PT_SUFFIX} file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{str(path)!r}: not a PyTorch file (torch.save writes a zip archive; this "
                         "is not one: another format, or truncated)")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        text = str(err)
        if "Weights only load failed" not in text:
            raise ValueError(f"{str(path)!r}: not a readable PyTorch file ({text.splitlines()[0]})") from None
        found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\. |\n|$)", text)
        why = found.group(1).strip() if found else "objects other than tensors and plain containers"
        raise ValueError(f"{str(path)!r}: refused: the pickle holds more than tensors and plain "
                         f"containers ({why}); it was not unpickled and none of its code ran") from None
    except Exception as err:  # corrupted zip members, bad records: torch raises RuntimeError & co.
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{str(path)!r}: not a readable PyTorch file, corrupted or truncated "
                         f"({type(err).__name__}: {first})") from None


def read_pt(path: str | os.PathLike, config: TransformerConfig | None = None,
            allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and fully validate a ``.pt`` file; return ``(config, canonical weights)``.

    The file holds the config (the layout of `save_pt`), or is a bare ``model.state_dict()``, in
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
        if obj["format"] != PT_FORMAT:
            raise ValueError(f"{where!r}: expected format {PT_FORMAT!r}, got {obj['format']!r}")
        if obj["format_version"] != PT_FORMAT_VERSION:
            raise ValueError(f"{where!r}: unknown format_version {obj['format_version']!r}, "
                             f"this version reads {PT_FORMAT_VERSION}")
        if not isinstance(obj["config"], str):
            raise ValueError(f"{where!r}: 'config' expected a JSON string, "
                             f"got {type(obj['config']).__name__}")
        try:
            stored = TransformerConfig.from_json(obj["config"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where!r}: invalid config: {err}") from None
        if config is not None and config != stored:
            raise ValueError(f"{where!r}: the config given (the model's, or --config) differs from "
                             f"the one in the file in "
                             f"{config_differences(config, stored)}")
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


def save_pt(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write canonical weights as a ``.pt`` (layout in the module docstring), atomically."""
    path = Path(path)
    payload = {"format": PT_FORMAT, "format_version": PT_FORMAT_VERSION, "config": config.to_json(),
               "state_dict": to_state_dict(config, weights)}  # checks the weights (finite too)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: the archive's inner name does not vary with tmp
            torch.save(payload, f)

    write_atomically(path, write)
    return path


def read_foreign_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A ``.pt`` holding a state dict of another model (for `shared.importers`), as NumPy arrays.

    Loaded with ``torch.load(weights_only=True)``; the file must hold a flat ``{name: tensor}``
    (what ``torch.save(model.state_dict(), path)`` writes)."""
    obj = torch_load(path)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{str(path)!r}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    problems = [f"{k!r}: expected a tensor, got {type(v).__name__}"
                for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    problems += [f"{k!r}: expected a dense tensor with a NumPy dtype, got {v.layout} {v.dtype}"
                 for k, v in obj.items() if isinstance(v, torch.Tensor)
                 and (v.layout != torch.strided or v.dtype in (torch.bfloat16,) or v.is_quantized)]
    if problems:
        raise WeightsError(str(path), problems)
    return {k: v.detach().cpu().numpy().copy() for k, v in obj.items()}


# -- both formats ---------------------------------------------------------------------------------
def is_pt(path: str | os.PathLike) -> bool:
    return Path(path).suffix in PT_SUFFIXES


def read_checkpoint(path: str | os.PathLike, config: TransformerConfig | None = None,
                    allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` from a ``.pt`` file or a neutral checkpoint directory,
    fully validated (``config`` only for a ``.pt`` holding a bare state dict)."""
    if is_pt(path):
        return read_pt(path, config, allow_nonfinite)
    _refuse_other_files(path)
    if config is not None:
        raise ValueError(f"{str(path)!r}: a neutral checkpoint holds its config; do not pass one")
    return neutral.load_checkpoint(path, allow_nonfinite=allow_nonfinite)


def write_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                     weights: Mapping[str, np.ndarray]) -> Path:
    """Write a ``.pt``/``.pth`` file or (any other path) a neutral checkpoint directory, atomically."""
    if is_pt(path):
        return save_pt(path, config, weights)
    _refuse_other_files(path)
    return neutral.save_checkpoint(path, config, weights)


def load_model(path: str | os.PathLike, config: TransformerConfig | None = None,
               allow_nonfinite: bool = False) -> "Transformer":
    """A new `Transformer` (eval mode) with the weights of a ``.pt`` or a neutral directory."""
    from .model import Transformer
    config, weights = read_checkpoint(path, config, allow_nonfinite)
    model = Transformer(config)
    _import(model, weights, allow_nonfinite)
    return model.eval()


def load_into(model: "Transformer", path: str | os.PathLike, allow_nonfinite: bool = False) -> None:
    """Load a checkpoint into an existing model. The file is read and checked completely, and its
    config must equal ``model.config``, before any parameter is written: on error the model keeps
    its weights. (A ``.pt`` holding a bare state dict is read with ``model.config``.)"""
    if is_pt(path):
        config, weights = read_pt(path, model.config, allow_nonfinite)
    else:
        config, weights = read_checkpoint(path, None, allow_nonfinite)
    if config != model.config:
        raise ValueError(f"{str(path)!r}: the checkpoint's config differs from the model's in "
                         f"{config_differences(model.config, config)}")
    _import(model, weights, allow_nonfinite)


def save_model(model: "Transformer", path: str | os.PathLike) -> Path:
    """``model``'s weights and config as a ``.pt`` or (any other path) a neutral directory."""
    return write_checkpoint(path, model.config, model.export_weights())



# -- helpers --------------------------------------------------------------------------------------
def _import(model: "Transformer", weights: Mapping[str, np.ndarray], allow_nonfinite: bool) -> None:
    weights_io.import_weights(model, weights, allow_nonfinite=allow_nonfinite)


def _refuse_other_files(path) -> None:
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{str(path)!r}: torch_impl reads and writes a neutral checkpoint directory "
                         f"or a {PT_SUFFIX} file; this is neither (a tf_impl .weights.h5 converts with "
                         "`twins convert`)")



__all__ = ["read_checkpoint", "write_checkpoint", "load_model", "load_into", "save_model", "read_pt",
           "save_pt", "torch_load", "read_foreign_state_dict", "state_dict_layout", "to_state_dict",
           "from_state_dict", "PT_FORMAT", "PT_FORMAT_VERSION"]
