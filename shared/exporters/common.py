"""What every exporter shares: `ExportError` (every setting the target cannot express, at once) and
the check that a destination directory may be replaced. NumPy only."""
from __future__ import annotations

import os
from pathlib import Path


class ExportError(ValueError):
    """A config or destination an exporter refuses: every problem at once, in ``problems``."""

    def __init__(self, target: str, problems: list[str]):
        self.target, self.problems = target, problems
        listed = "\n  ".join(problems)
        super().__init__(f"{target}: {len(problems)} problem(s):\n  {listed}")


def check_replaceable(path: Path, files: set[str], what: str) -> None:
    """``path`` may be written: absent, or a directory holding only ``files`` (an earlier export);
    anything else is refused, never overwritten (FileExistsError naming it)."""
    if not path.exists():
        return
    if not path.is_dir() or not set(os.listdir(path)) <= files:
        raise FileExistsError(f"{str(path)!r} exists and is not {what}; refusing to overwrite it "
                              f"(expected a new path or a directory holding only {sorted(files)})")
