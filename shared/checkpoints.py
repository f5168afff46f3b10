"""Checkpoint formats, dispatched once: which format a path is, reading, writing, loading into a
model's config, refusing what no format of the caller reads. NumPy only.

A format is a `CheckpointFormat`: a name, the file suffixes that select it (none for the neutral
directory), and its ``read`` / ``write`` in canonical weights (`shared.weights`)::

    read(path, config=None, allow_nonfinite=False) -> (config, weights)   fully checked
    write(path, config, weights) -> Path                                  atomically

`NEUTRAL` is the framework-neutral directory of `shared.weights` (``config.json`` +
``model.safetensors``); each backend registers its native file (torch_impl ``.pt``, tf_impl
``.weights.h5``) in its own ``checkpoints`` module and passes ``(NEUTRAL, its format)`` here. A
path is dispatched by its suffix first; any other path is a neutral directory, except an existing
file, which is refused with a message naming the path and the formats the caller reads. Every
format of the project, these and the importers' and exporters', is a record of `shared.formats`,
which recognises paths for conversions and reads any of them.

The native readers share the per-tensor checks too (`read_stored`): the expected shape and dtype
from the config, finite values unless allowed, copies of one tied weight equal; one error naming
the file lists every problem.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, NamedTuple

import numpy as np

from .config import TransformerConfig
from .weights import (WeightsError, check_weights, config_mismatch, load_checkpoint,
                      save_checkpoint, tensor_problems, weight_schema)

Reader = Callable[..., "tuple[TransformerConfig, dict[str, np.ndarray]]"]
Writer = Callable[[str | os.PathLike, TransformerConfig, Mapping[str, np.ndarray]], Path]


# -- formats --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format.

    ``suffixes``: the endings of the file name that select it (``()``: a directory, the neutral
    format). ``describe``: a phrase for messages ("a .pt file"). ``takes_config``: ``read`` accepts
    a config (for a file that holds none, or to check against the one it holds); the neutral
    directory always holds its own and refuses one."""
    name: str
    suffixes: tuple[str, ...]
    read: Reader
    write: Writer
    describe: str
    takes_config: bool = True

    def matches(self, path: str | os.PathLike) -> bool:
        """True when the file name ends with one of ``suffixes`` (never for the neutral format)."""
        return any(Path(path).name.endswith(s) for s in self.suffixes)


def _read_neutral(path, config: TransformerConfig | None = None, allow_nonfinite: bool = False):
    if config is not None:
        raise ValueError(f"{str(path)!r}: a neutral checkpoint holds its config; do not pass one")
    return load_checkpoint(path, allow_nonfinite=allow_nonfinite)


NEUTRAL = CheckpointFormat("neutral", (), _read_neutral, save_checkpoint,
                           "a neutral checkpoint directory", takes_config=False)


# -- dispatch -------------------------------------------------------------------------------------
def format_of(path: str | os.PathLike, formats: tuple[CheckpointFormat, ...],
              owner: str = "this reader") -> CheckpointFormat:
    """The format of ``path`` among ``formats``: the one whose suffix ends its name; otherwise the
    neutral directory (an existing directory, or a path not yet written), when ``formats`` holds it.
    An existing file that no format reads is refused, naming the path and what ``owner`` reads."""
    for fmt in formats:
        if fmt.matches(path):
            return fmt
    directories = [f for f in formats if not f.suffixes]
    p = Path(path)
    if directories and not (p.exists() and not p.is_dir()):
        return directories[0]
    described = " or ".join(f.describe for f in formats)
    raise ValueError(f"{str(path)!r}: {owner} reads and writes {described}; this is "
                     f"{'neither' if len(formats) == 2 else 'none of them'} (another format converts "
                     "with `twins convert`)")


def read_checkpoint(path: str | os.PathLike, formats: tuple[CheckpointFormat, ...],
                    config: TransformerConfig | None = None, allow_nonfinite: bool = False,
                    owner: str = "this reader") -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` of ``path`` in its format (`format_of`), fully checked.
    ``config`` is for a native file that holds none (or must equal the one it holds)."""
    return format_of(path, formats, owner).read(path, config, allow_nonfinite)


def write_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                     weights: Mapping[str, np.ndarray], formats: tuple[CheckpointFormat, ...],
                     owner: str = "this reader") -> Path:
    """Write ``weights`` and ``config`` to ``path`` in its format (`format_of`), atomically."""
    return format_of(path, formats, owner).write(path, config, weights)


def read_for(path: str | os.PathLike, config: TransformerConfig, formats: tuple[CheckpointFormat, ...],
             allow_nonfinite: bool = False, owner: str = "this reader") -> dict[str, np.ndarray]:
    """The canonical weights of ``path`` for a model of ``config`` (the generic half of a
    backend's ``load_into``): read and checked completely, and the file's config must equal
    ``config``, before the caller writes anything. A native file that holds no config is read with
    ``config``."""
    fmt = format_of(path, formats, owner)
    stored, weights = fmt.read(path, config if fmt.takes_config else None, allow_nonfinite)
    if stored != config:
        raise ValueError(config_mismatch(path, config, stored))
    return weights


# -- the per-tensor checks of every native reader -------------------------------------------------
class Slot(NamedTuple):
    """One tensor a native file must hold for a config: the canonical weight it stores (None for
    state that is no weight: it must be present, its value is not used), its shape and dtype as
    stored, and whether it is stored transposed (torch's ``nn.Linear`` keeps ``(out, in)``)."""
    name: str | None
    shape: tuple[int, ...]
    dtype: str
    transposed: bool = False


class Stored(NamedTuple):
    """One tensor as a native file holds it, before its values are read: shape, dtype name, and
    ``read()`` -> a NumPy array (called only when shape and dtype are right)."""
    shape: tuple[int, ...]
    dtype: str
    read: Callable[[], np.ndarray]


_LISTED = 30  # names listed per problem


def _listed(items) -> str:
    items = list(items)
    more = f" ... and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return f"{items[:_LISTED]}{more}"


def read_stored(config: TransformerConfig, layout: Mapping[str, Slot], stored: Mapping[str, object],
                source: str, allow_nonfinite: bool = False, what: str = "keys",
                label: Callable[[str], str] = str, problems: list[str] | None = None
                ) -> dict[str, np.ndarray]:
    """Canonical weights from the tensors of a native file, every one checked first.

    ``layout`` maps each key the file must hold (a state-dict key, an HDF5 dataset path) to its
    `Slot`; ``stored`` maps each key the file does hold to a `Stored`, or to a string: a problem
    the native reader already found with that entry (not a tensor, say), reported as it is.
    Checked: missing and unexpected keys (``what`` names them: "keys", "datasets"), each tensor's
    shape and dtype against the config, finite values unless ``allow_nonfinite``, and copies of one
    tied weight that disagree. One `WeightsError` naming ``source`` lists every problem (after
    ``problems``, any the reader found before); nothing is returned half-checked. Returns owned,
    C-contiguous arrays in `weight_schema` order, kernels ``(in, out)``.
    """
    problems = list(problems or [])
    missing = [k for k in layout if k not in stored]
    unexpected = sorted(k for k in stored if k not in layout)
    if missing:
        problems.append(f"missing {what}: {_listed(label(k) for k in missing)}")
    if unexpected:
        problems.append(f"unexpected {what}: {_listed(unexpected)}")
    arrays: dict[str, np.ndarray] = {}
    firsts: dict[str, str] = {}
    for key, slot in layout.items():
        entry = stored.get(key)
        if entry is None:
            continue
        if isinstance(entry, str):  # the native reader's own refusal of this entry
            problems.append(f"{key}: {entry}")
            continue
        found = tensor_problems(label(key), slot.shape, slot.dtype, entry.shape, entry.dtype,
                                (" (from the config)", " (the config's)"))
        problems += found
        if found or slot.name is None:
            continue
        array = np.asarray(entry.read())
        if not allow_nonfinite and not np.isfinite(array).all():
            problems.append(f"{label(key)}: contains NaN or Inf")
        array = np.array(array.T if slot.transposed else array, dtype=slot.dtype, order="C", copy=True)
        if slot.name in arrays:  # one weight stored twice (a tied one): both copies must agree
            if arrays[slot.name].tobytes() != array.tobytes():
                problems.append(f"{label(key)}: expected the same values as {firsts[slot.name]} "
                                "(one tied weight), got different ones")
            continue
        arrays[slot.name], firsts[slot.name] = array, key
    if problems:
        raise WeightsError(source, problems)
    check_weights(config, arrays, source=source, allow_nonfinite=allow_nonfinite)  # the invariant
    return {name: arrays[name] for name in weight_schema(config)}
