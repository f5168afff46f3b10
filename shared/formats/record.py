"""The record of one format (`Format`) and of one of its options (`Option`). NumPy only.

A format is read into, and written from, the project's one in-memory form: a `TransformerConfig`
and its canonical weights (`shared.weights`, kernels ``(in, out)``). Every format has one record,
in the module of its family; `shared.formats` lists them all (docs/formats/README.md: adding one).

The two functions of a record have one signature each, for every format::

    read(path, config=None, **options) -> (TransformerConfig, {canonical name: array})
    write(config, weights, path, **options) -> str | None      (a line saying what was written)

``read`` returns weights fully checked (`shared.weights.check_weights`) or raises, naming the path;
``write`` writes atomically or crash-safely: ``path`` is the old content or the complete new one.
``options`` are the keywords the record declares (`Option`), already checked by `shared.formats`:
only declared ones, the required ones present.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

Reader = Callable[..., tuple]
Writer = Callable[..., "str | None"]


@dataclass(frozen=True)
class Option:
    """One option of a format's ``read`` or ``write``: the keyword ``name`` (``--name-with-dashes``
    on the command line), its help, how a command-line string becomes its value (``type``),
    ``choices``, and ``repeat`` for one given several times (a list)."""
    name: str
    help: str
    type: Callable[[str], Any] = str
    choices: tuple | None = None
    metavar: str | None = None
    repeat: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Format:
    """One format.

    ``describe``: what a path of it is ("a directory: config.json + model.safetensors").
    ``recognise(path, role)``: True when ``path`` is, as ``role`` ("source" / "destination"), of
    this format, telling it from the path alone (or a directory's own description of itself); a
    format never recognised needs ``--from`` / ``--to``. ``fallback``: recognised only when no
    other format is (the neutral directory: any directory); ``looks_like``: what it recognises, for
    messages ("*.pt / *.pth"). ``read`` / ``write``: None for a
    format that is only written / only read. ``read_options`` / ``write_options``: its own options;
    ``required``: the read options it cannot do without. ``takes_config``: ``read`` accepts a
    config (a file that may hold none); otherwise ``config_from`` says where its config comes from,
    for the message refusing one. ``runs_in``: what runs it in ``twins convert --verify``
    ("reference", "torch", "tf", "transformers", "ctranslate2", "saved-model", "onnxruntime";
    None: no model of the source can be built here, its imported weights are compared in all
    three implementations). ``notes``: said after every conversion from it. ``hints``: for an option it
    does not take, why (``{"norm_first": "always pre-norm"}``). ``verify_full_rows``: ``--verify``
    compares unpadded target rows (a format whose padded positions differ by design).
    ``family``: the module declaring it (and the docs page, ``docs/formats/<family>.md``)."""
    name: str
    family: str
    describe: str
    read: Reader | None = None
    write: Writer | None = None
    recognise: Callable[[Path, str], bool] = lambda path, role: False
    fallback: bool = False
    looks_like: str = ""
    read_options: tuple[Option, ...] = ()
    write_options: tuple[Option, ...] = ()
    required: tuple[str, ...] = ()
    takes_config: bool = False
    config_from: str = "holds its config"
    runs_in: str | None = None
    notes: tuple[str, ...] = ()
    hints: Mapping[str, str] = field(default_factory=dict)
    verify_full_rows: bool = False

    @property
    def directions(self) -> str:
        """``read``, ``write`` or ``read/write``."""
        return "/".join(d for d, f in (("read", self.read), ("write", self.write)) if f is not None)

    def options(self, direction: str) -> tuple[Option, ...]:
        return self.read_options if direction == "read" else self.write_options


# -- recognising paths ------------------------------------------------------------------------------
def suffixes(*endings: str) -> Callable[[Path, str], bool]:
    """Recognised by the end of the file name (``.weights.h5``: the whole ending, not the last dot)."""
    return lambda path, role: any(Path(path).name.endswith(e) for e in endings)


def boolean(text: str) -> bool:
    """``true|false``: explicit either way (a wrong placement or mask loads silently)."""
    import argparse
    value = str(text).lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def rename(text: str) -> tuple[str, str]:
    """``OLD=NEW``: one key-prefix mapping (OLD may be empty, to add a prefix)."""
    import argparse
    old, sep, new = str(text).partition("=")
    if not sep or old == new or "=" in new:  # "==" meant a prefix "=", and a hint would print it untypable
        raise argparse.ArgumentTypeError(f"expected OLD=NEW with OLD != NEW and one '=', got {text!r}")
    return old, new


# -- options several formats share (one declaration, one flag) ---------------------------------------
N_HEADS = Option("n_heads", "attention heads (not stored in a state dict)", int)
PAD_ID = Option("pad_id", "padding id", int)
BOS_ID = Option("bos_id", "begin-of-sequence id (not stored in the file)", int)
EOS_ID = Option("eos_id", "end-of-sequence id (not stored in the file)", int)
NORM_EPS = Option("norm_eps", "layer-norm eps (default: the source library's)", float)
MAX_LEN = Option("max_len", "positions the model takes (default: the source's positional table)", int)
DTYPE = Option("dtype", "cast the weights to this dtype (default: the source's)",
               choices=("float32", "float64"))
RENAME = Option("rename", "replace the source key prefix OLD by NEW before reading (repeatable; "
                "e.g. src_tok_emb.=src_tok_emb.embedding.)", rename, metavar="OLD=NEW", repeat=True)
ALLOW_NONFINITE = Option("allow_nonfinite", "read NaN/Inf weights instead of refusing them "
                         "(to inspect a diverged run)", boolean, metavar="true|false")


def given(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options actually given: None (and an empty repeat) means "not given"."""
    # `== []` only of a list: a NumPy value compares element-wise ("truth value ... ambiguous")
    return {k: v for k, v in options.items() if v is not None and not (isinstance(v, list) and not v)}


def as_path(path: str | os.PathLike) -> str:
    return os.fspath(path)
