"""Entry point of the `twins` command (also `python -m twins`)."""
from __future__ import annotations

import argparse
import sys

from . import compare, convert, decode, figures, train


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
    p = sub.add_parser("train", help="train the copy or dates demo in torch or tf (resumable, in "
                                     "either backend); a neutral checkpoint at the end")
    train.add_arguments(p)
    p.set_defaults(run=train.run)
    p = sub.add_parser("decode", help="decode inputs or the held-out set with a demo checkpoint, in "
                                      "either backend")
    decode.add_arguments(p)
    p.set_defaults(run=decode.run)
    p = sub.add_parser("figures", help="write PNG figures: positional encoding, masks, Noam curves, "
                                       "training curves and attention of trained demo models")
    figures.add_arguments(p)
    p.set_defaults(run=figures.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as err:
        print(f"twins {args.command}: error: {err}", file=sys.stderr)
        return 2
