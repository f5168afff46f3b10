"""When the reader of stdout goes away: ``twins decode ... | head -1``.

The rest of the output then has nowhere to go, which is not an error. A C tool dies of SIGPIPE
there, silently, and the shell reports 128 + 13 = 141. Python ignores SIGPIPE (a write raises
``BrokenPipeError`` instead), so the command line ends the same way itself, as the signal module's
"Note on SIGPIPE" recommends: no message, stdout pointed at devnull (the interpreter's last flush
cannot fail again), and `EXIT_PIPE`. Not the note's suggested status 1: here 1 means "parity
failed" (`twins compare`, `convert --verify`), and a script under ``set -o pipefail`` must not read
a closed pipe as that; 141 is what it sees of every C tool in the same pipe. Not SIGPIPE's default
action either: that would also kill the process on a broken socket or a child's pipe, where an
error message is due. So a ``BrokenPipeError`` is silent only when stdout's reader is in fact gone.

`twins train --workers N` (torch): rank 0 alone prints, so it is the worker that meets the closed
pipe and exits `EXIT_PIPE`; the other ranks then fail in their next collective, a consequence of
that exit, and end silently too while stdout's reader is gone; the launcher returns `EXIT_PIPE`
(`twins.parallel.launch`).
"""
from __future__ import annotations

import os
import sys

EXIT_PIPE = 141  # 128 + SIGPIPE (13 on Linux, macOS and the BSDs), as a shell reports it


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (a socket, a terminal) whose reader has gone: poll reports POLLERR
    (Linux) or POLLHUP (BSD, macOS) on its descriptor. False when stdout has no descriptor (an
    in-process capture: nothing can break it); True where poll does not exist (Windows), as the
    signal module's note assumes."""
    import select
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever the mask
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def caused_by_closed_stdout(err: BaseException) -> bool:
    """Whether ``err`` follows from stdout's reader having gone: a ``BrokenPipeError`` then, or,
    in a torchrun worker other than rank 0, any error then (module docstring)."""
    if not isinstance(err, BrokenPipeError) and not _later_worker():
        return False
    return stdout_reader_gone()


def exit_silently() -> int:
    """Point stdout at devnull (what is still buffered is dropped there, not raised at exit) and
    return `EXIT_PIPE`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # no descriptor to redirect: nothing will flush into the closed pipe
    return EXIT_PIPE


def _later_worker() -> bool:
    """This process is a torchrun worker other than rank 0 (`twins.parallel.in_torchrun`)."""
    return "LOCAL_RANK" in os.environ and os.environ.get("RANK", "0") != "0"
