"""Entry point of the `twins` command (also `python -m twins`)."""
from __future__ import annotations

import argparse
import sys

from . import compare, convert


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twins", description="The Transformer in NumPy, PyTorch and TensorFlow, proven to agree.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compare", help="run one set of weights in every implementation and compare "
                                       "every intermediate (exit 1 when parity fails)")
    compare.add_arguments(p)
    p.set_defaults(run=compare.run)
    p = sub.add_parser("convert", help="convert weights between a neutral checkpoint directory, a "
                                       "torch_impl .pt and a tf_impl .weights.h5, or import an "
                                       "nn.Transformer / Annotated Transformer state dict "
                                       "(--verify: exit 1 when parity fails)")
    convert.add_arguments(p)
    p.set_defaults(run=convert.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"twins {args.command}: error: {err}", file=sys.stderr)
        return 2
