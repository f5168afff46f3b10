"""`twins convert SRC DST`: weights from one format to another, exactly; ``--verify`` proves it.

The formats are the records of `shared.formats` (``--list-formats`` prints them): each says how a
path of it is recognised (``--from`` / ``--to`` name one instead), its own options, how it is
read into ``(config, canonical weights)`` and written from them, and what runs it in ``--verify``.
This module only drives them: the source is read and fully checked before anything is written,
the result is written atomically (a refusal leaves nothing behind), and ``--verify`` runs the
result beside its source (`twins.verify`), exit status 1 when it fails.
"""
from __future__ import annotations

import json
from pathlib import Path

from shared import formats
from shared import weights as neutral
from shared.importers.notes import collected
from shared.paths import holds_cwd

from . import arguments, loading


def add_arguments(parser) -> None:
    parser.add_argument("src", metavar="SRC", nargs="?", type=arguments.path,
                        help="the source: a file or directory of any readable format")
    parser.add_argument("dst", metavar="DST", nargs="?", type=arguments.path,
                        help="the destination, replaced atomically if it exists (a directory is "
                             "neutral, *.pt torch, *.weights.h5 tf; others need --to)")
    parser.add_argument("--list-formats", action="store_true",
                        help="print every format (name, read/write, what it is) and exit")
    parser.add_argument("--verify", action="store_true",
                        help="run one batch through source and result, print the parity table "
                             "(for a saved-model: its decoded tokens against tf_impl's); exit 1 "
                             "when it fails")
    parser.add_argument("--seed", type=arguments.seed, help="seed of the --verify batch (default 0)")
    loading.add_arguments(parser, write=True)


def run(args) -> int:
    if args.list_formats:
        print("\n".join(formats.table()))
        return 0
    if args.src is None or args.dst is None:
        raise ValueError("SRC and DST are required (or --list-formats)")
    if args.seed is not None and not args.verify:  # it was ignored: nothing draws a batch
        raise ValueError("--seed: seeds the batch of --verify, and --verify is not given")
    dst_fmt = (formats.get(args.dst_format, "write", "--to") if args.dst_format
               else formats.detect(args.dst, "destination"))
    src, dst = Path(args.src).resolve(), Path(args.dst).resolve()
    if src == dst:
        raise ValueError(f"SRC and DST are the same path ({args.src!r}); write elsewhere")
    if dst in src.parents:  # a directory export replaces DST whole: the source inside it would go too
        raise ValueError(f"DST {args.dst!r} contains SRC {args.src!r}: replacing it would delete the "
                         "source; write elsewhere")
    if holds_cwd(dst):  # replaced whole: a shell would be left in a deleted folder
        raise ValueError(f"DST {args.dst!r} is the current directory or holds it, which a save "
                         "would replace; name a path inside it")
    given = loading.given_options(args)
    writes = {o.name for o in dst_fmt.write_options}
    write_options = formats.check_options(dst_fmt, "write", {k: v for k, v in given.items() if k in writes},
                                          spell=loading.flag)
    read_options = {k: v for k, v in given.items() if k not in writes}
    # an option only some other destination takes is named against --to, not against the source
    readers = {o.name for f in formats.REGISTRY for o in f.options("read")}
    misplaced = [k for k in read_options if k not in readers]
    if misplaced:
        raise ValueError("; ".join(f"{loading.flag(k)}: only for {formats.users(k)}, not --to "
                                   f"{dst_fmt.name}" for k in misplaced))
    try:
        with collected() as notes:  # a source's notes (half precision widened), printed first
            src_fmt, config, weights = loading.read(args.src, args, "SRC", read_options)
        for text in notes:
            print(f"note: {text}")
        said = formats.write(dst_fmt, config, weights, args.dst, **write_options)
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    except ValueError as err:
        raise loading.respelled(err, given) from None
    except ImportError as err:  # a bare import's message names only the module; a reader's says more
        said = f"a library is not installed ({err})" if err.name else str(err)
        raise ImportError(f"{args.src} -> {dst_fmt.name}: {said}") from None
    n_params = neutral.parameter_count(config)
    print(f"converted {args.src} ({src_fmt.name}) -> {args.dst} ({dst_fmt.name}): {n_params:,} "
          f"parameters in {len(weights)} tensors, {config.dtype}{': ' + said if said else ''}")
    print(f"config: {json.dumps(config.to_dict(), sort_keys=True)}")
    for note in src_fmt.notes:
        print(f"note: {note}")
    if not args.verify:
        return 0
    from .verify import verify
    return 0 if verify(src_fmt, args.src, dst_fmt, args.dst, config, weights, args.seed or 0) else 1
