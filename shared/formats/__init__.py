"""Every format the project reads or writes, one record each, and the one function that reads any
of them. NumPy only at import time: a format's library (torch, TensorFlow, h5py, ctranslate2) is
imported only when a file of it is read or written.

    read(path, format=None, config=None, **options) -> (TransformerConfig, canonical weights)
    write(format, config, weights, path, **options) -> a line saying what was written, or None

`read` is what `torch_impl.load_checkpoint`, `tf_impl.load_checkpoint` and every ``twins`` command
(``--checkpoint``) use, so each of them opens every format in `REGISTRY` that has a reader.
A path's format is recognised by the records (`detect`); ``format`` names it instead, a keyword
spelled as the backends' `load_checkpoint` and `save_checkpoint` spell it. The records are
declared by family, one module each (docs/formats/README.md says how to add one):

=================  ==================  =====================================================
module             formats             docs
=================  ==================  =====================================================
`.native`          neutral torch tf    docs/formats/native.md
`.state_dicts`     nn-transformer      docs/formats/state_dicts.md
                   annotated
`.hf`              marian fsmt         docs/formats/hf.md
`.keras`           tf-tutorial         docs/formats/keras.md
                   keras-hub
`.ctranslate2`     ctranslate2         docs/formats/ctranslate2.md
`.saved_model`     saved-model         docs/formats/saved_model.md
`.onnx`            onnx                docs/formats/onnx.md
=================  ==================  =====================================================
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from shared import checkpoints as dispatch
from shared.checks import check_config, check_flag
from shared.paths import check_path, check_source
from shared.weights import config_mismatch

from . import ctranslate2, hf, keras, native, onnx, saved_model, state_dicts
from .record import Format, Option, given

# One line per family; the order is the order of `twins convert --list-formats` and of recognition
# (a fallback format, the neutral directory, is tried last).
REGISTRY: tuple[Format, ...] = (
    *native.FORMATS,
    *state_dicts.FORMATS,
    *hf.FORMATS,
    *keras.FORMATS,
    *ctranslate2.FORMATS,
    *saved_model.FORMATS,
    *onnx.FORMATS,
)
_BY_NAME = {f.name: f for f in REGISTRY}
assert len(_BY_NAME) == len(REGISTRY), "two formats share a name"


def names(direction: str | None = None) -> tuple[str, ...]:
    """The formats' names, in registry order; ``direction`` "read" / "write": those that can."""
    return tuple(f.name for f in REGISTRY if direction is None or _can(f, direction))


def _can(fmt: Format, direction: str) -> bool:
    return (fmt.read if direction == "read" else fmt.write) is not None


def _check_word(value, name: str, allowed: tuple) -> None:
    """An argument that takes one of a few words (``direction``, ``role``): a misspelt one would
    otherwise be read as another ("sideways" as "write")."""
    if value not in allowed or not (value is None or isinstance(value, str)):
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")


def get(name: str, direction: str | None = None, flag: str = "format") -> Format:
    """The record named ``name``; ``direction``: it must read / write. Errors name ``flag``."""
    _check_word(direction, "direction", ("read", "write", None))
    if not isinstance(name, str):  # a list would fail as unhashable, naming nothing
        raise TypeError(f"{flag}: expected a format name (one of {', '.join(names(direction))}), got "
                        f"{type(name).__name__}")
    fmt = _BY_NAME.get(name)
    if fmt is None or (direction and not _can(fmt, direction)):
        role = {"read": "readable ", "write": "writable ", None: ""}[direction]
        why = "" if fmt is None else f" ({name} is {fmt.directions} only)"
        raise ValueError(f"{flag}: expected one of the {role}formats {', '.join(names(direction))}, "
                         f"got {name!r}{why}")
    return fmt


def options(direction: str | None = None) -> dict[str, Option]:
    """Every option of every format (one per name), in registry order."""
    found: dict[str, Option] = {}
    for fmt in REGISTRY:
        for d in (("read", "write") if direction is None else (direction,)):
            for option in fmt.options(d):
                if found.setdefault(option.name, option) != option:
                    raise AssertionError(f"option {option.name} declared twice, differently")
    return found


def users(name: str) -> str:
    """Who takes option ``name``: "--from a / b or --to c"."""
    parts = []
    for direction, flag in (("read", "--from"), ("write", "--to")):
        takers = [f.name for f in REGISTRY if any(o.name == name for o in f.options(direction))]
        if takers:
            parts.append(f"{flag} {' / '.join(takers)}")
    return " or ".join(parts)


def detect(path: str | os.PathLike, role: str = "source", flag: str | None = None) -> Format:
    """The format of ``path`` as ``role`` ("source" or "destination"): the one record that
    recognises it, else the fallback (the neutral directory); anything else is refused, naming what
    is recognised and ``flag``, what names a format instead (default the command line's ``--from``
    / ``--to``)."""
    _check_word(role, "role", ("source", "destination"))
    check_path(path)  # '' would be the current directory, a neutral one
    p = Path(path)
    direction = "read" if role == "source" else "write"
    candidates = [f for f in REGISTRY if _can(f, direction)]
    for fmt in [f for f in candidates if not f.fallback] + [f for f in candidates if f.fallback]:
        if fmt.recognise(p, role):
            return fmt
    flag = flag or ("--from" if role == "source" else "--to")
    raise ValueError(f"{str(path)!r}: cannot tell the {role} format from the path "
                     f"({recognised(direction)}); "
                     f"pass {flag} with one of {', '.join(names(direction))}")


def recognised(direction: str | None = None) -> str:
    """What paths are recognised as, for messages: "*.pt / *.pth is torch, ...", the fallback last."""
    found = [f for f in REGISTRY if f.looks_like and (direction is None or _can(f, direction))]
    return ", ".join(f"{f.looks_like} is {f.name}" for f in sorted(found, key=lambda f: f.fallback))


def check_options(fmt: Format, direction: str, options: Mapping[str, Any], config=None,
                  spell=lambda name: name) -> dict[str, Any]:
    """The options given for ``fmt``'s ``direction``: each declared by it, the required ones
    present, a config only where it reads one. ``spell`` names an option as the caller typed it
    (the command line: ``--n-heads``). Returns them without the ones not given. ``fmt``: a
    record or its name."""
    _check_word(direction, "direction", ("read", "write"))
    fmt = _record(fmt, direction) if not isinstance(fmt, Format) else fmt
    if not isinstance(options, Mapping):
        raise TypeError(f"options: expected a mapping of option name -> value, got {type(options).__name__}")
    flag = "--from" if direction == "read" else "--to"
    declared = {o.name for o in fmt.options(direction)}
    # None means "not given" (the command line passes every format's options), but a name that no
    # format takes is refused whatever its value: a misspelt keyword
    unknown = [name for name in options if name not in declared and not users(name)]
    options = given(options)
    problems = []
    for name in list(options) + [name for name in unknown if name not in options]:
        if name in declared:
            continue
        why = fmt.hints.get(name)
        if why is None:
            held = f", which {fmt.config_from}" if direction == "read" else ""
            takers = users(name)
            why = (f"only for {takers}, not {flag} {fmt.name}{held}" if takers else
                   f"not an option of {flag} {fmt.name}{held}")
        problems.append(f"{spell(name)}: {why}")
    if direction == "read":
        lacking = [spell(n) for n in fmt.required if n not in options]
        if lacking:
            problems.append(f"{flag} {fmt.name}: {', '.join(lacking)} required (not stored in the "
                            "file)")
        if config is not None and not fmt.takes_config:
            problems.append(f"{spell('config')}: {flag} {fmt.name} {fmt.config_from}; do not pass one")
    if problems:
        raise ValueError("; ".join(problems))
    return options


def read(path: str | os.PathLike, format: str | Format | None = None, config=None, **options):
    """``(config, canonical weights)`` of ``path``, fully checked, in ``format`` (a name or a
    record; default: recognised from the path, `detect`). ``config``: for a native file that holds
    none (or must equal the one it holds); ``options``: the format's own (`Format.read_options`).
    (``format`` was ``fmt`` before session 38; ``format=`` was then taken for an option of the
    format the path looked like, and refused as none.)"""
    check_source(path)  # a FIFO or a device: refused before anything reads it
    if config is not None:  # named here: a reader's comparison named it "given"
        check_config(config)
    record = _record(format, "read") if format is not None else detect(path, "source")
    options = check_options(record, "read", options, config)
    return record.read(path, config, **options)


def detected(path: str | os.PathLike) -> Format | None:
    """The format `detect` recognises ``path`` as a source, or None where none does (a backend's
    dispatcher then refuses it, naming what that backend reads)."""
    try:
        return detect(path, "source")
    except ValueError:
        return None


def _check_read_arguments(config, allow_nonfinite) -> None:
    """A backend's readers' own arguments, named, before the path is looked at."""
    if config is not None:
        check_config(config)
    check_flag(allow_nonfinite, "allow_nonfinite")


def read_for_backend(path: str | os.PathLike, native_formats: tuple, owner: str, config=None,
                     allow_nonfinite: bool = False, format: str | None = None, **options):
    """A backend's ``read_checkpoint`` (the generic half, written once): a native file of the
    backend or a neutral directory through its own dispatcher (``native_formats``, a
    `shared.checkpoints.CheckpointFormat` each; a path no record recognises is refused there,
    naming ``owner``), any other format through `read`. ``format``: its name, which then decides
    whatever the path says (a ``.pt`` file saved under another name is read as one); ``options``:
    that format's own."""
    _check_read_arguments(config, allow_nonfinite)
    check_source(path)
    # `is not None`, as `destination`: a format of "" or 0 was read as "not given"
    fmt = get(format, "read", "format") if format is not None else detected(path)
    native = {f.name: f for f in native_formats}
    if fmt is not None and fmt.name in native and not options:
        if format is not None:  # named: that reader, as `twins convert --from` and every other backend read it
            return native[fmt.name].read(path, config, allow_nonfinite)
        return dispatch.read_checkpoint(path, native_formats, config, allow_nonfinite, owner=owner)
    if fmt is None:
        return dispatch.read_checkpoint(path, native_formats, config, allow_nonfinite, owner=owner)
    return read(path, fmt, config, allow_nonfinite=allow_nonfinite, **options)


def read_for_model(path: str | os.PathLike, config, native_formats: tuple, owner: str,
                   allow_nonfinite: bool = False) -> dict:
    """The canonical weights of ``path`` for a model of ``config`` (a backend's ``load_into``, the
    generic half): read and checked completely, and the file's config equal to ``config``, before
    the caller writes anything. A native file of the backend (``native_formats``) that holds no
    config is read with ``config``."""
    _check_read_arguments(config, allow_nonfinite)
    check_source(path)
    fmt = detected(path)
    if fmt is None or fmt.name in {f.name for f in native_formats}:
        return dispatch.read_for(path, config, native_formats, allow_nonfinite, owner=owner)
    stored, weights = read(path, fmt, allow_nonfinite=allow_nonfinite)
    if stored != config:
        raise ValueError(config_mismatch(path, config, stored))
    return weights


def destination(path: str | os.PathLike, format: str | None = None) -> Format:
    """The format a backend's ``save_checkpoint`` / ``write_checkpoint`` writes ``path`` in:
    ``format``, a writable format's name, or else the one the path says as a destination
    (`detect`: ``*.pt`` torch, ``*.weights.h5`` tf, a new path without a suffix or a directory
    neutral), as `twins convert` chooses; errors name ``format``. So a path no format claims
    (``model.onnx`` without ``format="onnx"``) is refused, never written as something else."""
    check_path(path)
    if format is not None:
        return get(format, "write", "format")
    return detect(path, "destination", flag="format=")


def write(format: str | Format, config, weights: Mapping, path: str | os.PathLike,
          **options) -> str | None:
    """Write ``config`` and ``weights`` to ``path`` in ``format`` (a name or a record), atomically
    (or refuse before writing anything); ``options``: the format's own (`Format.write_options`)."""
    record = _record(format, "write")
    return record.write(config, weights, path, **check_options(record, "write", options))


def _record(fmt: str | Format, direction: str) -> Format:
    return get(fmt.name if isinstance(fmt, Format) else fmt, direction)


def table() -> list[str]:
    """One line per format: name, directions, what it is (``twins convert --list-formats``)."""
    width = max(len(f.name) for f in REGISTRY)
    return [f"{f.name:<{width}}  {f.directions:<10}  {f.describe}" for f in REGISTRY]


__all__ = ["Format", "Option", "REGISTRY", "check_options", "destination", "detect", "get", "names",
           "options", "read", "table", "users", "write"]
