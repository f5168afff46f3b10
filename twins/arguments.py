"""argparse types the commands share: a bad value is a usage error naming the flag, raised while
the command line is parsed, so before anything is read, written or started
(``twins convert: error: argument --seed: expected an int >= 0, got -1``)."""
from __future__ import annotations

from shared.checks import int_argument


def seed(text: str) -> int:
    """A random seed: an int >= 0 (NumPy's generators take no negative seed)."""
    return int_argument(text, 0)
