"""Started by every Python process whose ``PYTHONPATH`` holds this folder (see
parity_tests/importable.py): installs the ``TWINS_BLOCK`` import blocker first thing.

The checkout's root goes on ``sys.path`` first (at its end, so nothing it holds shadows an
installed package), so that the blocker imports where the project is not installed, e.g. a
checkout run with a bare ``python -m pytest``."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from parity_tests.importable import install_from_env  # noqa: E402

install_from_env()
