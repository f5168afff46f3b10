"""argparse types the commands share: a bad value is a usage error naming the flag, raised while
the command line is parsed, so before anything is read, written or started
(``twins convert: error: argument --seed: expected an int >= 0, got -1``)."""
from __future__ import annotations

from shared.checks import int_argument


# TensorFlow's seeds are below 2**32 and `twins train` seeds a run's dropout with seed + step + a
# multiple of the worker's rank: a seed below 2**31 leaves that sum room in both backends.
SEED_MAX = 2**31 - 1


def seed(text: str) -> int:
    """A random seed: an int in [0, `SEED_MAX`] (NumPy takes no negative seed, TensorFlow none of
    2**32 or more: a larger one failed in one backend and ran in the other)."""
    return int_argument(text, 0, SEED_MAX)
