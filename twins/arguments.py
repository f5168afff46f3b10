"""argparse types the commands share: a bad value is a usage error naming the flag, raised while
the command line is parsed, so before anything is read, written or started
(``twins convert: error: argument --seed: expected an int >= 0, got -1``)."""
from __future__ import annotations

import argparse


def seed(text: str) -> int:
    """A random seed: an int >= 0 (NumPy's generators take no negative seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {value}")
    return value
