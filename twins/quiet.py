"""TensorFlow's start-up log lines, kept off the command line's stderr unless ``--verbose``.

``TF_CPP_MIN_LOG_LEVEL`` does not silence them all: the lines written "before absl::InitializeLog()"
(oneDNN's notice, the CPU-feature notice) ignore it. So, for the duration of a command, file
descriptor 2 is a pipe read by a thread that drops exactly those lines and passes every other byte
to the real stderr (the command's own messages, tqdm's bar, Python warnings).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

# absl's C++ log prefix of an info or warning line (severity, date, time, thread, file:line]) and its one-time notice; the
# continuation line of the CPU-feature notice.
_TF_LINE = re.compile(rb"^(?:[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\] |WARNING: All log messages "
                      rb"before absl::InitializeLog\(\)|To enable the following instructions: )")


_terminal: list[bool] = []  # within `tf_logs_hidden`: whether stderr was a terminal before it


def stderr_is_terminal() -> bool:
    """Whether the command's stderr is a terminal: what it was before `tf_logs_hidden` made file
    descriptor 2 a pipe (a progress bar asks, and would otherwise never be drawn)."""
    return _terminal[-1] if _terminal else os.isatty(2)


@contextlib.contextmanager
def tf_logs_hidden():
    """Within the block, TensorFlow's C++ log lines never reach stderr; everything else does."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read, write = os.pipe()
    except (OSError, ValueError):  # no usable fd 2 (an embedded interpreter): nothing to filter
        yield
        return
    _terminal.append(os.isatty(saved))
    os.dup2(write, 2)
    os.close(write)
    pump = threading.Thread(target=_pump, args=(read, saved), daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the pump reads EOF and ends
        pump.join(timeout=5)
        os.close(saved)
        _terminal.pop()


def _pump(read: int, out: int) -> None:
    pending = b""
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not _TF_LINE.match(line):
                    os.write(out, line + b"\n")
            if pending and not _TF_LINE.match(pending) and b"\r" in pending:
                os.write(out, pending)  # a progress bar redraws its line without a newline
                pending = b""
    if pending and not _TF_LINE.match(pending):
        os.write(out, pending)
