"""argparse types the commands share: a bad value is a usage error naming the flag, raised while
the command line is parsed, so before anything is read, written or started
(``twins convert: error: argument --seed: expected an int >= 0, got -1``)."""
from __future__ import annotations

import argparse
import contextlib

from shared.checks import int_argument
from shared.config import PRESETS
from shared.devices import parse_device
from shared.precision import ALIASES


# TensorFlow's seeds are below 2**32 and `twins train` seeds a run's dropout with seed + step + a
# multiple of the worker's rank: a seed below 2**31 leaves that sum room in both backends.
SEED_MAX = 2**31 - 1


def seed(text: str) -> int:
    """A random seed: an int in [0, `SEED_MAX`] (NumPy takes no negative seed, TensorFlow none of
    2**32 or more: a larger one failed in one backend and ran in the other)."""
    return int_argument(text, 0, SEED_MAX)


def integer(text: str) -> int:
    """Any int as typed: an optional sign and ASCII digits (`shared.checks.int_argument`). For the
    options whose range a command checks itself, after parsing (``--batch 0`` is "expected a
    positive int", named by the command); ``int`` as a type took ``"1_0"`` and other scripts' digits."""
    return int_argument(text)


def path(text: str) -> str:
    """A file or directory path: anything but the empty string, refused while the command line is
    parsed (``argument --config: expected a path, got ''``). ``Path("")`` is the current
    directory, and an empty option read as "not given" ran the default preset, model or config."""
    if text == "":
        raise argparse.ArgumentTypeError("expected a path, got ''")
    if "\0" in text:  # only from main(argv) in a program: a shell cannot pass one
        raise argparse.ArgumentTypeError(f"expected a path without a NUL character, got {text!r}")
    return text


def preset(text: str) -> str:
    """A preset's name (`shared.config.PRESETS`), refused while the command line is parsed with
    the names to choose from: ``''`` is no name (it read as "no preset": the default model)."""
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(sorted(PRESETS))}, got {text!r}")
    return text


def device(text: str) -> str:
    """A device's name as `shared.devices` spells it (``cpu``, ``cuda``, ``cuda:N``), refused
    while the command line is parsed (``argument --device: expected cpu, cuda or cuda:N, got
    'gpu'``); whether the framework sees that GPU is asked when the model is built."""
    try:
        parse_device(text, "")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(": ")) from None
    return text


@contextlib.contextmanager
def flags(*names: str):
    """A ValueError raised inside whose message begins with one of the library's argument
    ``names`` (``device: ...``) is raised again naming the flag the user typed (``--device:
    ...``), as every other usage error of a command does."""
    try:
        yield
    except ValueError as err:
        name = str(err).partition(":")[0]
        if name not in names:
            raise
        raise ValueError(f"--{name.replace('_', '-')}{str(err)[len(name):]}") from None


def choices(names) -> str:
    """``names`` as argparse shows a ``choices`` list (``{float32,bfloat16}``): the metavar of an
    option whose type checks the names itself."""
    return "{" + ",".join(names) + "}"


def precision(*allowed: str, why: str = ""):
    """The argparse type of a command's ``--precision``: a name `shared.precision` takes (its
    canonical names, and ``fp32``, ``bf16``, ``fp16``) whose canonical name is one of ``allowed``,
    returned as typed (a later message quotes it so; the command keeps the canonical name). Every
    command spells a precision the same way (``twins train`` took only ``fp32`` / ``bf16``,
    ``twins decode`` only ``float32`` / ``bfloat16`` / ``float16``); ``why``: why a precision
    `shared.precision` names is not one of ``allowed``."""
    def parse(text: str) -> str:
        name = ALIASES.get(text)
        if name not in allowed:
            reason = f" ({why})" if name is not None and why else ""
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}, got {text!r}{reason}")
        return text
    parse.__name__ = "precision"  # argparse's fallback message names the type
    return parse
