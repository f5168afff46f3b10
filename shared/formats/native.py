"""The project's own checkpoints: the neutral directory, torch_impl's ``.pt``, tf_impl's
``.weights.h5`` (docs/formats/native.md). All three hold the same numbers and the config.

The neutral directory is read and written here (`shared.weights`: NumPy + safetensors). A
backend's native file is read and written by that backend's ``checkpoints`` module, which this
module imports by name when such a file is used, never before (`backend`): the dependency rule's
one plugin seam (docs/design.md), so that `shared.formats.read` opens every format for every
caller, and a missing framework is an error naming the extra that installs it.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from shared.checkpoints import NEUTRAL

from .record import ALLOW_NONFINITE, Format, suffixes

# The backends' own suffixes (torch_impl.checkpoints.PT_SUFFIXES, tf_impl.checkpoints.H5_SUFFIX);
# parity_tests/test_formats.py checks they agree.
PT_SUFFIXES = (".pt", ".pth")
H5_SUFFIXES = (".weights.h5",)
_EXTRAS = {"torch_impl": "torch", "tf_impl": "tf-cpu"}


def backend(module: str):
    """The backend module ``module`` ("torch_impl.checkpoints"), imported now; an ImportError
    naming the extra to install when its framework is missing."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"this file is read and written by {package}, which is not installed "
                          f"({err}); install the '{_EXTRAS[package]}' extra") from None


def _directory(path: Path, role: str) -> bool:
    """A directory, or as a destination a path without a file suffix that does not exist yet."""
    return path.is_dir() or (role == "destination" and not path.exists() and not path.suffix)


def _read_neutral(path, config=None, allow_nonfinite=False):
    return NEUTRAL.read(path, config, allow_nonfinite)


def _write_neutral(config, weights, path):
    NEUTRAL.write(path, config, weights)


def _reader(module: str):
    def read(path, config=None, allow_nonfinite=False):
        return backend(module).read_native(path, config, allow_nonfinite)
    return read


def _writer(module: str):
    def write(config, weights, path):
        backend(module).write_native(path, config, weights)
    return write


NEUTRAL_FORMAT = Format(
    "neutral", "native", "a directory: config.json + model.safetensors (NumPy, no framework)",
    read=_read_neutral, write=_write_neutral, recognise=_directory, fallback=True,
    looks_like="another directory",
    read_options=(ALLOW_NONFINITE,), runs_in="reference")
TORCH = Format(
    "torch", "native", "a torch_impl .pt / .pth (torch.load(weights_only=True) reads it)",
    read=_reader("torch_impl.checkpoints"), write=_writer("torch_impl.checkpoints"),
    recognise=suffixes(*PT_SUFFIXES), looks_like="*.pt / *.pth", read_options=(ALLOW_NONFINITE,),
    takes_config=True,
    runs_in="torch")
TF = Format(
    "tf", "native", "a tf_impl .weights.h5 (Keras save_weights, the config inside)",
    read=_reader("tf_impl.checkpoints"), write=_writer("tf_impl.checkpoints"),
    recognise=suffixes(*H5_SUFFIXES), looks_like="*.weights.h5", read_options=(ALLOW_NONFINITE,),
    takes_config=True,
    runs_in="tf")

FORMATS = (NEUTRAL_FORMAT, TORCH, TF)
