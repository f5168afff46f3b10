"""Argument types the benchmarks share (a script's own directory is first on ``sys.path``, and the
checkout's root before it, for `shared`)."""
from __future__ import annotations

from shared.checks import int_argument


def positive(text: str) -> int:
    """An argparse type: an int >= 1 (`shared.checks.int_argument`'s rule and message, as the
    commands' counts)."""
    return int_argument(text, 1)
