"""Entry point of the `twins` command (also `python -m twins`).

Exit status: 0 success; 1 a parity check failed (`compare`, `convert --verify`), or a data-parallel
worker of `train --workers` died (which rank, and the signal); 2 an error: a
usage error (argparse's own and the commands' checks of their options), a bad input file, an
operating-system error (permission denied, disk full, a read-only folder), out of memory; 130
interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM: ``timeout``, a batch scheduler; `twins train`
saves its run on either); 141, silently, when the reader of stdout went away (``twins decode ... | head -1``:
`twins.pipes`, as a shell reports a C tool that SIGPIPE ended). Every error is one line,
``twins <command>: error: ...``, naming the user's path or option as typed; never a traceback,
unless ``--verbose`` asks for one (and for TensorFlow's start-up log lines, which are hidden
otherwise).
"""
from __future__ import annotations

import argparse
import sys
import traceback

from shared import formats
from shared.threads import set_runtime_policy

from . import compare, convert, decode, figures, pipes, train

COMMANDS = {
    "compare": (compare, "run one set of weights in every implementation and compare every "
                         "intermediate (exit 1 when parity fails)"),
    "convert": (convert, f"convert weights between formats ({', '.join(formats.names())}; "
                         "--list-formats), exactly (--verify: exit 1 when parity fails)"),
    "train": (train, "train the copy or dates demo in torch or tf (resumable, in either backend); a "
                     "neutral checkpoint at the end"),
    "decode": (decode, "decode token ids with any checkpoint (or a demo's text), in either backend"),
    "figures": (figures, "write PNG figures: positional encoding, masks, Noam curves, training "
                         "curves and attention of trained demo models"),
}


class Parser(argparse.ArgumentParser):
    """argparse's usage errors as every other error of the command: one line, exit 2 (argparse
    prints its whole usage block first), pointing at ``--help``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given before or after the command name, neither parser's default overwrites it
    common.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show TensorFlow's start-up log lines and, on an error, the traceback")
    parser = Parser(
        prog="twins", parents=[common],
        description="The Transformer in NumPy, PyTorch and TensorFlow, proven to agree.")
    # Not required here: `parse` names what was given instead of a command (argparse would report
    # the missing command before an unknown option, as "the following arguments are required").
    sub = parser.add_subparsers(dest="command")  # its parsers: Parser too
    parser.commands = {}
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, parents=[common])
        module.add_arguments(p)
        p.set_defaults(run=module.run)
        parser.commands[name] = p
    return parser


def _numbers_as_values(parser: Parser, argv: list[str]) -> list[str]:
    """``argv`` with ``--OPTION -inf`` written ``--OPTION=-inf`` where the option takes one value
    and the token is a number argparse reads as an option (it takes ``-1`` and ``-0.5`` as
    numbers, not ``-inf``, ``-nan`` or ``-1e3``, and answered "expected one argument"): the value
    then reaches the option's own check, which names what it expects."""
    command = next((parser.commands[a] for a in argv if a in parser.commands), None)
    actions = {**parser._option_string_actions, **(command._option_string_actions if command else {})}
    out = []
    for token in argv:
        previous = actions.get(out[-1]) if out else None
        if (previous is not None and previous.nargs is None and token.startswith("-")
                and token not in actions and _is_number(token)):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line parsed; an argument no option takes is an error of its command's
    (``twins train: error: unrecognized arguments: --bogus``), not of ``twins``; with no command,
    an error of ``twins`` naming the commands and what was given instead."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(_numbers_as_values(parser, argv))
    if args.command is None:
        got = f"unrecognized arguments: {' '.join(extras)}; " if extras else ""
        parser.error(f"{got}expected a command ({', '.join(COMMANDS)})")
    if extras:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def describe(err: BaseException) -> str:
    """One line for an error: an OS error as ``'PATH': reason`` (the path the user gave, or the
    file it names), anything else as its message (first line, for a framework's long text)."""
    if isinstance(err, OSError) and err.strerror and err.filename is not None:
        where = repr(str(err.filename))
        if err.filename2 is not None:
            where += f" -> {str(err.filename2)!r}"
        return f"{where}: {err.strerror}"
    if isinstance(err, MemoryError):
        return f"out of memory{': ' + str(err) if str(err) else ''} (try a smaller model, batch or length)"
    text = str(err).strip() or type(err).__name__
    problems = getattr(err, "problems", None)
    if isinstance(problems, list) and problems and all(isinstance(p, str) for p in problems):
        # WeightsError, ImporterError, ExportError: "SOURCE: N problem(s): first; second; ..."
        return f"{text.splitlines()[0]} " + "; ".join(" ".join(p.split()) for p in problems)
    return text.splitlines()[0] if not isinstance(err, (ValueError, TypeError, OSError)) else \
        " ".join(line.strip() for line in text.splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (module docstring)."""
    try:
        return _main(argv)
    except BrokenPipeError as err:  # argparse's --help into a closed pipe (a command's: in _run)
        if not pipes.caused_by_closed_stdout(err):
            raise
        return pipes.exit_silently()


def _main(argv: list[str] | None) -> int:
    # Before any framework is imported: idle OpenMP threads sleep, torch's large allocations take
    # huge pages (shared.threads explains why).
    set_runtime_policy()
    args = parse(argv)  # usage errors: argparse exits 2, "twins <cmd>: error: ..." (Parser)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `twins train --workers` relaunches it
    args.verbose = getattr(args, "verbose", False)
    if sys.stdout is None:  # started with descriptor 1 closed (`twins ... >&-`): before any file opens
        print(f"twins {args.command}: error: stdout: closed (expected an open standard output; "
              ">/dev/null discards it)", file=sys.stderr)
        return 2
    stdout, sys.stdout = sys.stdout, NamedStdout(sys.stdout)
    try:
        if args.verbose:
            return _run(args)
        from .quiet import tf_logs_hidden
        with tf_logs_hidden():
            return _run(args)
    finally:
        sys.stdout = stdout


class StdoutError(OSError):
    """A write to stdout failed (a full disk, ``/dev/full``, an I/O error): ``stdout: REASON``; the
    OSError itself names no file (``[Errno 28] No space left on device``)."""

    def __str__(self) -> str:
        return f"stdout: {self.strerror or 'write failed'}"


class NamedStdout:
    """``sys.stdout`` while a command runs: the stream itself, but a failed write or flush raises
    `StdoutError`. A ``BrokenPipeError`` stays what it is (`twins.pipes`: a reader that went away)."""

    def __init__(self, stream):
        self._stream = stream

    def _call(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as err:
            if isinstance(err, StdoutError):
                raise
            raise StdoutError(err.errno, err.strerror) from err

    def write(self, text):
        return self._call(self._stream.write, text)

    def writelines(self, lines):
        return self._call(self._stream.writelines, lines)

    def flush(self):
        return self._call(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _run(args) -> int:
    try:
        status = args.run(args)
        sys.stdout.flush()  # what is still buffered meets a closed pipe or a full disk here, not at exit
        return status
    except KeyboardInterrupt:
        print(f"twins {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (the one place every error becomes one line)
        if pipes.caused_by_closed_stdout(err):
            return pipes.exit_silently()  # not an error, even with --verbose
        if isinstance(err, StdoutError):  # what is still buffered would fail again at exit: dropped
            pipes.exit_silently()
        if args.verbose:  # the traceback, then the same one line and exit status (1 is a failed check)
            traceback.print_exc()
        known = isinstance(err, (ValueError, TypeError, OSError, ImportError, MemoryError))
        kind = "" if known else f"{type(err).__name__}: "
        hint = "" if known or args.verbose else " (--verbose shows the traceback)"
        print(f"twins {args.command}: error: {kind}{describe(err)}{hint}", file=sys.stderr)
        return 2
