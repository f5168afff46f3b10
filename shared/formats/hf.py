"""transformers ``save_pretrained`` directories: MarianMT (OPUS-MT) and FSMT
(docs/formats/hf.md). NumPy + safetensors: neither transformers nor torch is needed to
read or write one; transformers runs one only in ``twins convert --verify``.

Recognised as a source by the directory's own ``config.json`` (``"model_type": "marian"`` /
``"fsmt"``), so ``--from`` is not needed; a destination needs ``--to marian``.
"""
from __future__ import annotations

import json
from pathlib import Path

from shared import exporters, importers

from .record import ALLOW_NONFINITE, DTYPE, RENAME, Format
from .state_dicts import UNIFORM_EMPTY_ROW, named

_FROM_CONFIG = "reads the config from the directory's config.json"


def model_type(path: Path, role: str) -> str | None:
    """``config.json``'s ``model_type`` of an existing directory ``path`` (a source), else None."""
    if role != "source":
        return None
    config_json = Path(path) / "config.json"
    if not config_json.is_file():  # a FIFO there would block the read
        return None
    try:
        header = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # not JSON: not this format's
        return None
    if not isinstance(header, dict) or "format_version" in header:
        return None  # this project's own (an ONNX export writes Marian's keys beside its config)
    return header.get("model_type")


def _reader(function):
    def read(path, config=None, **options):
        return named(path, function, path, options)
    return read


def _write_marian(config, weights, path):
    exporters.to_marian(path, config, weights)


MARIAN = Format(
    "marian", "hf", "a transformers MarianMTModel directory (config.json + model.safetensors)",
    read=_reader(importers.from_marian), write=_write_marian,
    recognise=lambda path, role: model_type(path, role) == "marian",
    looks_like="a directory whose config.json says marian",
    read_options=(DTYPE, RENAME, ALLOW_NONFINITE), config_from=_FROM_CONFIG, runs_in="transformers",
    notes=(UNIFORM_EMPTY_ROW.format(source="marian in transformers' eager attention (its default, "
                                           "sdpa, gives that row zero attention, as here)"),))
FSMT = Format(
    "fsmt", "hf", "a transformers FSMTForConditionalGeneration directory (fairseq WMT19)",
    read=_reader(importers.from_fsmt), recognise=lambda path, role: model_type(path, role) == "fsmt",
    looks_like="a directory whose config.json says fsmt", verify_full_rows=True,
    read_options=(DTYPE, RENAME, ALLOW_NONFINITE), config_from=_FROM_CONFIG, runs_in="transformers",
    notes=(UNIFORM_EMPTY_ROW.format(source="fsmt"),
           "fsmt numbers positions by counting non-pad tokens; the result computes the same on "
           "right-padded rows (outputs at padded target positions aside), not after a left or "
           "inner pad"))

FORMATS = (MARIAN, FSMT)
