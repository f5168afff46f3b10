"""Crash-safe saving: a file replaced atomically, a directory replaced so that the path holds the
complete old directory or the complete new one at every instant, and recovery of a save that a
crash interrupted (docs/design.md, section "Saving and recovery"). NumPy-free, framework-free.

A directory save (`replace_directory`) runs these steps; a crash (power loss, SIGKILL) may stop it
after any of them:

1. **stage**: ``fill(staging)`` writes the new directory into a hidden sibling
   ``.NAME.twins-PID-RANDOM.new``; every file and the directory are fsynced.
2. **swap**: where the kernel can exchange two paths atomically (Linux ``renameat2`` with
   ``RENAME_EXCHANGE``, ext4, xfs, btrfs, tmpfs, ...), one call exchanges the staging directory and
   ``NAME``: ``NAME`` is the old directory, then the new one, never absent, never half of either.
   Elsewhere (another OS, a file system that refuses the exchange) the swap is two renames guarded
   by a marker file ``.NAME.twins-swap`` written (atomically) before them: ``NAME`` -> ``.old``,
   then staging -> ``NAME``. Between the two renames ``NAME`` is absent, but the marker says where
   both complete copies are, and `recover` finishes the swap.
3. **clean**: the old directory (now under the staging name) is removed; the marker, if any, last.

`recover(path)` runs before every load and save of a directory (`shared.weights.load_checkpoint`,
`save_checkpoint`, `twins train`, `twins decode`, `twins convert`): with a marker it completes the
interrupted swap (the staged directory is complete, so it rolls forward; without one it puts the
old directory back), and it removes the temporary siblings of ``NAME`` left by a process that no
longer runs (the PID in the name; a live process's staging directory is never touched). When it
cannot repair (the folder is read-only, say) it raises `InterruptedSave`, naming where the data is.

Fault injection: with the environment variable ``TWINS_FAULT_AT`` naming a step (`FAULT_POINTS`),
the saving process kills itself with SIGKILL when it reaches that step, so the tests can show that
every step is safe with real process deaths. ``TWINS_NO_EXCHANGE=1`` forces the marker protocol
(to test it where the exchange works).
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable, Collection, Sequence

from .paths import check_source, holds_cwd, read_json, replaced

# Where a save may be killed, in order (TWINS_FAULT_AT=<one of these>).
FAULT_POINTS = ("config-written", "staging", "staged", "marked", "moved-old", "swapped", "cleaned")
_TAG = ".twins-"  # every temporary sibling of NAME is ".NAME.twins-..."
_MARKER = "swap"


class InterruptedSave(OSError):
    """A save was interrupted and cannot be repaired here; the message says where the data is."""

    def __str__(self) -> str:
        return str(self.strerror)


def naming(err: OSError, path: Path) -> OSError:
    """``err`` as the same kind of OS error on the user's ``path`` (not on a temporary sibling the
    user never named): ``'path': No space left on device``."""
    if isinstance(err, InterruptedSave) or err.errno is None:
        return err
    return OSError(err.errno, err.strerror or str(err), str(path))  # the errno's subclass


def fault_point(step: str) -> None:
    """Kill this process with SIGKILL when ``TWINS_FAULT_AT`` names ``step`` (tests only)."""
    if os.environ.get("TWINS_FAULT_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory's entry list: what a rename changed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path``, then every directory, deepest first."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


# A sibling's name must fit the file system's limit on one name (255 bytes on ext4, xfs, btrfs,
# tmpfs, APFS, NTFS) with its tail: the tag, a PID, mkstemp's random part and a suffix such as
# ".tmp.weights.h5" or "marker.tmp" (at most 64 bytes). NAME is kept whole up to 190 bytes;
# a longer one is cut and told apart from its neighbours by a hash of the whole.
_NAME_BYTES, _CUT_BYTES = 190, 160


def _hidden(path: Path) -> str:
    """``.NAME.twins-``: the start of every temporary sibling of ``path``, NAME shortened to
    ``CUT~HASH`` where it is too long to leave room for the rest (a name of 250 bytes is a valid
    destination, and its staging directory must be creatable too)."""
    name, raw = path.name, os.fsencode(path.name)
    if len(raw) > _NAME_BYTES:  # bytes cut mid-character decode to escapes that encode back to them
        name = f"{os.fsdecode(raw[:_CUT_BYTES])}~{hashlib.sha256(raw).hexdigest()[:16]}"
    return f".{name}{_TAG}"


def temporary_name(path: Path) -> str:
    """The prefix of a hidden sibling of ``path`` owned by this process: ``.NAME.twins-PID-`` (then
    a random part and a suffix); `recover` removes it once the process is gone."""
    return f"{_hidden(path)}{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _marker(path: Path) -> Path:
    return path.parent / f"{_hidden(path)}{_MARKER}"


def _leftovers(path: Path) -> list[Path]:
    """Temporary siblings of ``path`` whose owning process is gone (never a live one's)."""
    prefix = _hidden(path)
    out = []
    try:
        names = os.listdir(path.parent)
    except (FileNotFoundError, NotADirectoryError):  # no folder there: nothing beside the path
        return out
    for name in names:
        if not name.startswith(prefix) or name == _marker(path).name:
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            out.append(path.parent / name)
    return out


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        _rmtree(p)
    else:
        p.unlink()


def _rmtree(p: Path, ignore_errors: bool = False) -> None:
    """``shutil.rmtree``, also through directories their owner made read-only (a user's ``chmod
    a-w`` folder inside a replaced directory): removing an entry needs its directory writable,
    so a refused removal makes that directory writable and tries once more. Only directories are
    changed: a file may be a hard link shared with the new directory (`_carry`)."""
    def retry(func, path, _):
        try:
            parent = os.path.dirname(path)
            os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
            if func is not os.unlink and os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
            func(path)
        except OSError:
            if not ignore_errors:
                raise
    handler = {"onexc": retry} if sys.version_info >= (3, 12) else {"onerror": retry}
    try:
        shutil.rmtree(p, **handler)
    except OSError:
        if not ignore_errors:
            raise


def make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the directories this call created, outermost first (none that
    existed or that another process made meanwhile), for `remove_made` to take back."""
    missing, p = [], Path(folder)
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:  # "new/.." (the folder above, once "new" is made), or a racer's
                if not os.path.isdir(d):
                    raise
                continue
            made.append(d)
    except BaseException:
        remove_made(made)
        raise
    if not os.path.isdir(folder):  # a file (or a dangling link) where a folder goes, as mkdir -p says
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(folder))
    return made


def remove_made(made: Sequence[Path]) -> None:
    """Remove the directories `make_parents` created that are empty, deepest first: a failed save
    leaves no folder it made, and a save to ``new/../X`` no ``new/`` beside ``X``. A directory that
    holds anything (the save's result, another process's file) is kept."""
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:  # not empty (holds the result, or someone's file), or already gone
            continue
        try:
            fsync_path(d.parent)
        except OSError:
            pass


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (no bytes copied, the file's own permissions), a copy where links fail."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


def _carry(source: Path, target: Path) -> None:
    """``source``, an entry of the directory being replaced, into the staged one as ``target``."""
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(source), str(target))


def check_not_read_only(path: str | os.PathLike) -> None:
    """Refuse to replace a directory its owner made read-only (no write bit for the owner: root
    could write it anyway) or one this process may not write; `replace_directory` checks it, and a
    command that works long before it saves (`twins train`) checks it first."""
    path = Path(path)
    if path.is_dir() and (not (path.stat().st_mode & stat.S_IWUSR) or not os.access(path, os.W_OK)):
        raise PermissionError(errno.EACCES, "Permission denied: the directory is read-only "
                              "(make it writable, chmod u+w, to replace it)", str(path))


def check_replaceable(path: str | os.PathLike, files: Collection[str], what: str,
                      belongs: Callable[[object], bool], marker: str = "config.json",
                      read: Callable[[Path], object] = read_json) -> None:
    """Refuse, before anything is written, to replace what a save does not own. ``path`` may be
    written when it is absent, an empty directory, or an earlier output of the same kind: a
    directory holding only names among ``files``, one of them ``marker`` (default
    ``config.json``), a regular file that ``read`` parses (default: JSON) and ``belongs`` says is
    that output's (a config that says so). Names alone never decide: a user's folder holding only
    ``config.json`` (their settings), ``model.bin`` or ``assets/`` is not an export, and a save
    that replaced it would delete it. An interrupted save of ``path`` is finished first
    (`recover`), so what is judged is what the path holds. Anything else raises
    ``FileExistsError`` naming ``path``; nothing is changed. Every export and the neutral
    checkpoint decide with it (`shared.exporters`, `shared.weights.save_checkpoint`,
    `tf_impl.saved_model`)."""
    path = Path(path)
    recover(path)
    if not os.path.exists(path):
        return
    names = set(os.listdir(path)) if path.is_dir() else None
    if names == set():
        return
    if names is not None and names <= set(files) and marker in names:
        try:
            check_source(path / marker, directory=False)  # a FIFO would block, a directory fail
            ours = bool(belongs(read(path / marker)))
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            ours = False  # unreadable, not the format, or not what belongs expects: not ours
        if ours:
            return
    raise FileExistsError(f"{str(path)!r} exists and is not {what}; refusing to overwrite it "
                          f"(expected a new path, an empty directory or {what} written earlier: "
                          f"its {marker} beside only {', '.join(sorted(files))})")


def _keep_modes(old: Path, new: Path) -> None:
    """The permission bits of the replaced directory, and of each file replaced by one of the same
    name, on the new ones: a save replaces the contents, not the owner's choice of who may read."""
    os.chmod(new, stat.S_IMODE(old.stat().st_mode))
    for entry in os.scandir(new):
        before = old / entry.name
        if entry.is_file(follow_symlinks=False) and before.is_file() and not before.is_symlink():
            os.chmod(entry.path, stat.S_IMODE(before.stat().st_mode))


def recover(path: str | os.PathLike) -> None:
    """Finish or undo a save of ``path`` that a crash interrupted, and remove its dead temporaries.

    Does nothing when there is nothing to do. Raises `InterruptedSave` naming the surviving copy
    when the repair itself fails (a read-only folder, say). A symbolic link is followed, as a
    save follows it (the temporaries are beside its target)."""
    path = Path(os.path.realpath(path) if os.path.islink(path) else path)
    marker = _marker(path)
    try:
        if marker.is_file():
            _finish_swap(path, marker)
        for p in _leftovers(path):
            _remove(p)
    except InterruptedSave:
        raise
    except OSError as err:
        survivors = [str(p) for p in ([path] if path.exists() else []) + _leftovers(path)
                     if p.is_dir()]
        if path.exists():  # the data is in place; only the clean-up failed: not worth refusing a load
            return
        raise InterruptedSave(
            errno.EIO, f"an interrupted save of {str(path)!r} could not be repaired ({err}); its "
            f"data is in {survivors or 'no surviving copy'}: rename one to {str(path)!r}") from None


def _finish_swap(path: Path, marker: Path) -> None:
    """The marker protocol's repair: roll forward to the staged directory if ``path`` is absent
    (it is complete: the marker is written only after it is fsynced), else the swap had finished."""
    try:
        names = json.loads(marker.read_text(encoding="utf-8"))
        new, old, pid = path.parent / names["new"], path.parent / names["old"], int(names["pid"])
    except (ValueError, KeyError, TypeError) as err:
        raise InterruptedSave(errno.EIO, f"{str(marker)!r}: unreadable swap marker ({err}); the data "
                              f"of {str(path)!r} is in it or in a sibling named {_hidden(path)}*") from None
    if pid != os.getpid() and _pid_alive(pid):
        return  # a save in progress in another process, not an interrupted one
    if not path.exists():
        source = new if new.is_dir() else old
        if not source.is_dir():
            raise InterruptedSave(errno.ENOENT, f"an interrupted save of {str(path)!r} left neither "
                                  f"{str(new)!r} nor {str(old)!r}")
        os.rename(source, path)
        fsync_path(path.parent)
    for p in (new, old):
        if p.exists():
            _remove(p)
    marker.unlink()
    fsync_path(path.parent)


# -- files ----------------------------------------------------------------------------------------
def write_atomically(path: str | os.PathLike, write: Callable[[str], None], suffix: str = ".tmp") -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, fsync it, then ``os.replace`` it into
    place: a crash leaves the old file or the new one, never half of one. ``suffix`` ends the
    temporary name (Keras insists on ``.weights.h5``). A symbolic link at ``path`` is followed
    (its target is replaced, the link stays); anything but a regular file there (a directory, a
    FIFO, a device) is refused (`shared.paths.replaced`)."""
    return write_all_atomically([(path, write)], suffix)[0]


def write_all_atomically(writes: Sequence[tuple[str | os.PathLike, Callable[[str], None]]],
                         suffix: str = ".tmp") -> list[Path]:
    """`write_atomically` for a set of files: every ``write(tmp)`` into a temporary file beside its
    path first, then each moved into place. A write that fails (a full disk, an error of its own)
    leaves every path as it was, not some new and some old; the moves are renames within each
    directory, which no shortage of space fails. Returns the paths written, in order."""
    staged: list[tuple[str, Path]] = []
    made: list[Path] = []  # parent folders this call created: removed again where left empty
    path = None
    try:
        for given, write in writes:
            path = Path(given)  # named by an error of `replaced` itself
            path = Path(replaced(given, directory=False))  # a link's target; a directory, FIFO, ... refused
            made += make_parents(path.parent)
            recover(path)
            fd, tmp = tempfile.mkstemp(prefix=temporary_name(path), suffix=f".tmp{suffix}",
                                       dir=path.parent)
            os.close(fd)
            staged.append((tmp, path))
            os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes it private; the result is an ordinary file
            write(tmp)
            fsync_path(tmp)
        fault_point("staged")
        for tmp, path in staged:
            os.replace(tmp, path)
        for parent in dict.fromkeys(path.parent for _, path in staged):
            fsync_path(parent)
        fault_point("swapped")
    except OSError as err:
        raise naming(err, path) from err
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        remove_made(made)
    return [path for _, path in staged]


# -- directories ----------------------------------------------------------------------------------
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange the paths ``a`` and ``b`` (Linux ``renameat2(RENAME_EXCHANGE)``).
    False where the OS or the file system cannot (the caller then uses the marker protocol)."""
    global _libc
    if os.environ.get("TWINS_NO_EXCHANGE") == "1" or not hasattr(os, "fsencode"):
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = _libc.renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28 / not Linux
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # this file system or kernel has no exchange
    raise OSError(err, os.strerror(err), str(b))


def replace_directory(path: str | os.PathLike, fill: Callable[[Path], None],
                      owned: Collection[str] | None = None) -> Path:
    """Make ``path`` the directory that ``fill(staging)`` writes, crash-safely (module docstring):
    at every instant ``path`` is the complete old directory or the complete new one (with the
    marker protocol, absent for two renames but recoverable by `recover`). ``fill`` receives an
    empty directory and writes the files; it need not fsync them. A symbolic link at ``path`` is
    followed (its target is replaced, the link stays), and anything but a directory there is
    refused (`shared.paths.replaced`); checking that a directory there may be replaced is the
    caller's.

    ``owned``: the names the save is the owner of (a training run's four files). When given, every
    other entry of the directory replaced (a user's notes, a folder of figures) is carried into
    the new one before the swap, as hard links where the file system allows; without it the new
    directory holds what ``fill`` wrote and nothing else (an export: a stale file of an older
    export would be read as part of the new one). The new directory keeps the old one's
    permission bits, and a file that replaces one of the same name keeps that file's. A directory
    made read-only (no write bit for its owner) is refused, not replaced."""
    path = Path(replaced(path, directory=True))
    which = holds_cwd(path)
    if which is not None:  # renaming it away fails ("Device or resource busy"), or strands a shell
        raise ValueError(f"{str(path)!r}: expected a directory a save can replace, got {which}; "
                         "name a path inside it")
    made: list[Path] = []  # parent folders this call created: removed again where left empty
    try:
        made = make_parents(path.parent)
        recover(path)
        check_not_read_only(path)
        staging = Path(tempfile.mkdtemp(prefix=temporary_name(path), suffix=".new", dir=path.parent))
    except BaseException as err:
        remove_made(made)
        if isinstance(err, OSError):
            raise naming(err, path) from err
        raise
    old = None
    try:
        os.chmod(staging, 0o777 & ~umask())  # mkdtemp makes it private; a checkpoint is an ordinary dir
        fill(staging)
        if path.is_dir():
            if owned is not None:
                for name in sorted(set(os.listdir(path)) - set(owned) - set(os.listdir(staging))):
                    _carry(path / name, staging / name)
            _keep_modes(path, staging)
        fault_point("staging")  # (the tests write part of the files before this point)
        fsync_tree(staging)
        fault_point("staged")
        if not path.exists():
            os.rename(staging, path)  # atomic; refused if another save created path meanwhile
            fsync_path(path.parent)
            fault_point("swapped")
        elif _exchange(staging, path):
            fsync_path(path.parent)
            fault_point("swapped")  # staging now holds the old directory
        else:
            old = Path(str(staging)[: -len(".new")] + ".old")
            _write_marker(path, {"new": staging.name, "old": old.name, "pid": os.getpid()})
            fault_point("marked")
            os.rename(path, old)
            fsync_path(path.parent)
            fault_point("moved-old")
            os.rename(staging, path)
            fsync_path(path.parent)
            fault_point("swapped")
            _marker(path).unlink()
            fsync_path(path.parent)
    except OSError as err:
        raise naming(err, path) from err
    finally:
        if old is not None and not path.exists() and old.exists():
            _put_back(path, old)
        if old is None or path.exists():  # nothing moved away, or one copy in place: the rest goes
            for p in (staging, old):
                if p is not None and p.exists():
                    _rmtree(p, ignore_errors=True)
        remove_made(made)  # after a failure; after success, one that holds no result (new/../X)
    fault_point("cleaned")
    return path


def _put_back(path: Path, old: Path) -> None:
    """A save stopped between its two renames by an exception (an OSError of the second rename or
    its fsync, Ctrl-C): the old directory back at ``path`` and the marker gone, so that nothing
    was changed. Before, both copies were then removed, the old and the new. Where even this
    rename fails, both stay, for `recover` (the marker names them)."""
    try:
        os.rename(old, path)
        _marker(path).unlink()
    except OSError:
        pass


def _write_marker(path: Path, names: dict) -> None:
    """The swap marker of ``path``, written atomically (a torn marker would hide where the data is)."""
    marker = _marker(path)
    tmp = path.parent / f"{temporary_name(path)}marker.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(names, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    fsync_path(marker.parent)
