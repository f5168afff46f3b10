"""What every exporter shares: `ExportError` (every setting the target cannot express, at once) and
the check that a destination directory may be replaced (`check_replaceable`, written once in
`shared.saving` for the exporters and the neutral checkpoint alike). NumPy only."""
from __future__ import annotations

from ..saving import check_replaceable

__all__ = ["ExportError", "check_replaceable"]


class ExportError(ValueError):
    """A config or destination an exporter refuses: every problem at once, in ``problems``."""

    def __init__(self, target: str, problems: list[str]):
        self.target, self.problems = target, problems
        listed = "\n  ".join(problems)
        super().__init__(f"{target}: {len(problems)} problem(s):\n  {listed}")
