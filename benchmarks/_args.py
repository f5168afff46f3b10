"""Argument types the benchmarks share (a script's own directory is first on ``sys.path``)."""
from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """An argparse type: an integer >= 1, else an error naming what was given."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value
