"""Any checkpoint the format registry reads, for every command: ``--from`` and each format's own
options on the command line, and `read` (one call, `shared.formats.read`). ``twins convert``,
``compare --checkpoint``, ``decode --checkpoint`` and ``figures`` all load through here.
"""
from __future__ import annotations

import re
from pathlib import Path

from shared import TransformerConfig, formats
from shared.paths import check_source, read_json, replaced
from shared.saving import recover
from shared.weights import WeightsError

from . import arguments


def check_output(option: str, path, inputs: dict[str, object]) -> None:
    """``path`` (a ``--json FILE``) may be written once the command's work is done: a path (``-``
    is stdout, not checked here), where a regular file may go (`shared.paths.replaced`: a FIFO
    would block, a directory cannot be replaced by a file), and none of the command's ``inputs``
    (``{flag: path}``) nor a file inside one: a result written over the checkpoint it was decoded
    from, or over its --src-file, destroyed them. Checked before anything runs."""
    if path == "":
        raise ValueError(f"{option}: expected a file path ('-' for stdout), got ''")
    target = Path(replaced(path, directory=False)).resolve()
    for name, given in inputs.items():
        if given is None or given == "":
            continue
        source = Path(given).resolve()
        if target == source or source in target.parents:
            inside = "a file in " if target != source else ""
            raise ValueError(f"{option} {str(path)!r}: would overwrite {inside}{name} {str(given)!r}; "
                             "write elsewhere")


def flag(name: str) -> str:
    """An option's keyword as the command line spells it: ``n_heads`` -> ``--n-heads``."""
    return "--" + name.replace("_", "-")


def add_arguments(parser, write: bool = False, config: bool = True, skip: tuple[str, ...] = ()) -> None:
    """``--from`` (``--to`` with ``write``), ``--config`` (unless the command has its own) and every
    format's options (those named in ``skip`` are the command's own), each help naming the formats
    that take it."""
    listed = "`twins convert --list-formats`"
    parser.add_argument("--from", dest="src_format", metavar="FORMAT", choices=formats.names("read"),
                        help=f"the source's format, one of {', '.join(formats.names('read'))} "
                             f"(default: recognised from the path; {listed})")
    if write:
        parser.add_argument("--to", dest="dst_format", metavar="FORMAT", choices=formats.names("write"),
                            help=f"the destination's format, one of {', '.join(formats.names('write'))} "
                                 f"(default: recognised from the path)")
    if config:
        parser.add_argument("--config", metavar="FILE.json", type=arguments.path,
                            help="the config, for a .pt holding a bare torch_impl state dict or "
                                 "a .weights.h5 written by plain Keras save_weights (files written "
                                 "by this project hold theirs)")
    parser.set_defaults(format_options_skipped=skip)
    group = parser.add_argument_group("format options (what a file does not store; each says "
                                      "which formats take it)")
    for option in formats.options(None if write else "read").values():
        if option.name in skip:
            continue
        # an int option as typed: ASCII digits (int() took "1_0" and other scripts' digits)
        kind = arguments.integer if option.type is int else option.type
        group.add_argument(flag(option.name), dest=option.name, type=kind,
                           choices=option.choices, metavar=option.metavar,
                           action="append" if option.repeat else "store",
                           help=f"{option.help} [{formats.users(option.name)}]")


def given_options(args, direction: str | None = None) -> dict:
    """The format options given on the command line (``direction``: only that side's)."""
    skipped = getattr(args, "format_options_skipped", ())
    return {name: getattr(args, name) for name in formats.options(direction)
            if name not in skipped and getattr(args, name, None) not in (None, [])}


def config_of(args) -> TransformerConfig | None:
    """``--config``'s `TransformerConfig` for the source being read (None where not given): the
    config of a file that holds none (``decode --checkpoint bare.pt --config c.json``, as
    ``convert bare.pt out --config c.json``); a format that holds its own refuses one by name."""
    if getattr(args, "config", None) is None:
        return None
    return config_file(args.config)


def config_file(path: str, what: str = "--config") -> TransformerConfig:
    """The `TransformerConfig` of the JSON file ``path`` given as ``what``; every problem (not a
    regular file, not UTF-8, not JSON, not a config) a ValueError naming both; a file that cannot
    be opened (missing, unreadable) an OSError of the same kind naming both."""
    if not str(path):  # open("") fails as "'': No such file or directory", naming nothing
        raise ValueError(f"{what}: expected a path, got ''")
    try:
        data = read_json(path, what)
    except OSError as err:
        if err.strerror is None:  # already says what it is (a loop of links, named)
            raise
        raise type(err)(f"{what} {str(path)!r}: {err.strerror[:1].lower()}{err.strerror[1:]}") from None
    if isinstance(data, dict) and {"format_version", "config"} <= set(data):
        raise ValueError(f"{what} {path!r}: a checkpoint's config.json, not a TransformerConfig "
                         "(give the checkpoint itself with --checkpoint, or its 'config' object)")
    try:
        return TransformerConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} {path!r}: {err}") from None


def source_format(path: str, args) -> formats.Format:
    """``--from``'s record, or the one recognising ``path``."""
    if getattr(args, "src_format", None):
        return formats.get(args.src_format, "read", "--from")
    return formats.detect(path, "source")


def read(path: str, args, what: str = "--checkpoint", options: dict | None = None):
    """``(format, config, canonical weights)`` of ``path`` (as typed after ``what``), with the
    options given on the command line; an error names the flag as typed."""
    if not str(path):  # Path("") is the current directory
        raise ValueError(f"{what}: expected a path, got ''")
    recover(path)  # a save that a crash interrupted: finished (or refused, naming the data) first
    check_source(path, what)  # a FIFO or a device: refused before anything reads it
    if not Path(path).exists():
        raise FileNotFoundError(f"{what} {path!r}: no such file or directory")
    fmt = source_format(path, args)
    config = config_of(args)
    options = given_options(args, "read") if options is None else options
    options = formats.check_options(fmt, "read", options, config, spell=flag)
    try:
        config, weights = fmt.read(path, config, **options)
    except ValueError as err:
        raise respelled(err, options) from None
    except FileNotFoundError as err:  # a part of the source missing: "load_checkpoint: missing ..."
        if err.filename is not None:  # an OS error naming its file: `twins.cli.describe` names it
            raise
        said = re.sub(r"^[a-z_]+: ", "", str(err))  # the reader's own name: "load_checkpoint: "
        raise FileNotFoundError(f"{what} {str(path)!r}: not a {fmt.name} checkpoint ({said})") from None
    return fmt, config, weights


def respelled(err: ValueError, given=None) -> ValueError:
    """``"max_new: expected ..."`` from a format's function -> ``"--max-new: expected ..."``; in
    an error listing problems (an importer's), each problem about an option the user gave (``given``:
    their names) the same way, ``TransformerConfig.max_len: ...`` included (the config an option
    made)."""
    problems = getattr(err, "problems", None)
    if isinstance(err, WeightsError) and isinstance(problems, list) and given:
        fixed = [_respelled_line(p, given) if isinstance(p, str) else p for p in problems]
        return err if fixed == problems else type(err)(err.source, fixed)
    name, sep, rest = str(err).partition(":")
    if sep and name in formats.options():
        return type(err)(f"{flag(name)}:{rest}") if type(err) is ValueError else err
    return err


def _respelled_line(text: str, given) -> str:
    name, sep, rest = text.partition(":")
    bare = name.removeprefix("TransformerConfig.")
    return f"{flag(bare)}:{rest}" if sep and bare in given else text
