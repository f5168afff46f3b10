"""What a path is, for the checks made before reading a source and before replacing a
destination, and a small JSON file read safely (framework-free, NumPy-free).

A source must be a regular file or a directory: a FIFO blocks a reader until another process
writes, and a device such as ``/dev/zero`` never ends, so a reader that takes it for a file would
wait or fill the memory. A destination is replaced only by its own kind (`shared.saving`): a
file by a file, a directory by a directory; anything else there (a FIFO, a device, a socket) is
refused, not renamed over. Symbolic links are followed, as ``open`` follows them.
"""
from __future__ import annotations

import errno
import os
import stat

from .config import parse_json

_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """``"a regular file"``, ``"a directory"``, ``"a FIFO"``, ... for an ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _named(what: str, path) -> str:
    return f"{what} {str(path)!r}" if what else repr(str(path))


def check_path(path, name: str = "path") -> None:
    """A path argument is a non-empty ``str`` or ``os.PathLike`` of one; anything else is refused
    naming the argument (Python's own errors say "stat: path should be string, ..." and name none;
    bytes, which ``os`` takes, would fail later in ``pathlib``)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if isinstance(text, bytes):
        raise TypeError(f"{name}: expected a str or os.PathLike path, got bytes {path!r} "
                        "(decode it: os.fsdecode)")
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected a str or os.PathLike path, got {type(path).__name__}")
    if not text:
        raise ValueError(f"{name}: expected a path, got ''")
    if "\0" in text:  # else Python's "embedded null byte", naming nothing, from the first os call
        raise ValueError(f"{name}: expected a path without a NUL character, got {text!r}")


def check_source(path: str | os.PathLike, what: str = "", directory: bool = True) -> None:
    """Refuse a source that exists and is not a regular file (nor, with ``directory``, a
    directory), before anything reads it: ``"--src-file '/dev/zero': expected a regular file,
    got a character device"`` (``what``: the argument as its user typed it, or nothing). A path
    that does not exist passes (the reader names it in its own words), as does one that cannot be
    examined for another reason than a loop of links (its reader's ``open`` reports that). Not a
    path at all: `check_path`."""
    check_path(path, what or "path")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(f"{_named(what, path)}: a loop of symbolic links") from None
        return
    if stat.S_ISREG(mode) or (directory and stat.S_ISDIR(mode)):
        return
    expected = "a regular file or a directory" if directory else "a regular file"
    raise ValueError(f"{_named(what, path)}: expected {expected}, got {kind(mode)}")


def holds_cwd(path: str | os.PathLike) -> str | None:
    """What ``path`` is to the current directory, where a save could not replace it: "the current
    directory" or "a directory containing the current one" (links resolved; a directory swapped
    out under a shell leaves it in a deleted folder, and renaming ``.`` fails as "Device or
    resource busy"); None otherwise, or when the current directory no longer exists."""
    real = os.path.realpath(path)
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # removed: nothing can contain it
        return None
    if real == here:
        return "the current directory"
    if here.startswith(real.rstrip(os.sep) + os.sep):
        return "a directory containing the current one"
    return None


def replaced(path: str | os.PathLike, directory: bool) -> str:
    """Where a save of ``path`` writes: ``path``, or the end of its symbolic links (the links stay,
    the file or directory they lead to is replaced). Refused, before anything is written, where
    something other than what the save makes is there (``directory``: a directory, else a
    regular file): ``"'out.pt': is a FIFO; refusing to replace it with a file"``."""
    target = os.path.realpath(path) if os.path.islink(path) else os.fspath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(f"{str(path)!r}: a loop of symbolic links") from None
        raise
    if (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        return target
    made = "a directory" if directory else "a file"
    raise FileExistsError(f"{str(path)!r}: is {kind(mode)}; refusing to replace it with {made}")


def read_text(path: str | os.PathLike, what: str = "") -> str:
    """The UTF-8 text of the file ``path`` given as ``what`` (the argument as typed, or nothing):
    not a regular file refused (`check_source`), bytes that are not UTF-8 a ValueError naming the
    first with its offset. A missing file raises FileNotFoundError, naming it."""
    check_source(path, what, directory=False)
    with open(path, "rb") as f:
        return utf8_text(f.read(), _named(what, path))


def utf8_text(data: bytes, named: str) -> str:
    """``data`` as UTF-8 text; otherwise a ValueError starting with ``named`` (where the bytes
    came from, as the user gave it) and naming the first bad byte with its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{named}: expected UTF-8 text, got byte {data[err.start]:#04x} "
                         f"at offset {err.start}") from None


def read_json(path: str | os.PathLike, what: str = ""):
    """The JSON value of the file ``path`` (a config), every failure a ValueError naming ``what``
    and the path: `read_text`'s, and not JSON (`shared.config.parse_json`)."""
    return parse_json(read_text(path, what), _named(what, path))
