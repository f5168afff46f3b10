"""What every exporter shares: `ExportError` (every setting the target cannot express, at once) and
the check that a destination directory may be replaced. NumPy only."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..paths import read_json


class ExportError(ValueError):
    """A config or destination an exporter refuses: every problem at once, in ``problems``."""

    def __init__(self, target: str, problems: list[str]):
        self.target, self.problems = target, problems
        listed = "\n  ".join(problems)
        super().__init__(f"{target}: {len(problems)} problem(s):\n  {listed}")


def check_replaceable(path: Path, files: set[str], what: str, belongs: Callable[[dict], bool]) -> None:
    """``path`` may be written: absent, empty, or an earlier export: a directory holding only
    ``files``, among them a ``config.json`` that ``belongs`` says is that export's (a neutral
    checkpoint, ``config.json`` and ``model.safetensors``, holds only names a Marian export has,
    and was replaced by one). Anything else is refused, never overwritten (FileExistsError naming
    it)."""
    if not path.exists():
        return
    names = set(os.listdir(path)) if path.is_dir() else None
    if names == set():
        return
    if names is not None and names <= files and "config.json" in names:
        try:
            config = read_json(path / "config.json")
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict) and belongs(config):
            return
    raise FileExistsError(f"{str(path)!r} exists and is not {what}; refusing to overwrite it "
                          f"(expected a new path, an empty directory or an earlier export: only "
                          f"{sorted(files)})")
