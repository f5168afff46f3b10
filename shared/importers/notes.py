"""Notes of an import: what the import did that its user should know, though nothing is wrong (a
half-precision tensor widened to float32). NumPy only.

A note is a warning of class `ImportNote`, so a library user sees it as Python shows warnings and can
filter it; ``twins convert`` collects the notes of its read (`collected`) and prints each as a
``note:`` line of its output.
"""
from __future__ import annotations

import contextlib
import warnings


class ImportNote(UserWarning):
    """Something an import did that changes no computed value but should be said (a widening)."""


def note(text: str) -> None:
    """Emit ``text`` as an `ImportNote` (attributed to the importer's caller's caller)."""
    warnings.warn(text, ImportNote, stacklevel=3)


def note_widened(file, dtype: str, count: int) -> None:
    """The note of ``count`` tensors of ``dtype`` (float16, bfloat16) in ``file`` read as float32."""
    note(f"{str(file)!r}: {count} {dtype} tensor{'s' if count > 1 else ''} widened exactly to "
         f"float32 (every {dtype} value is a float32 value)")


@contextlib.contextmanager
def collected():
    """Collect the `ImportNote` texts emitted inside the block into the list it yields, each once
    (Python's warning registry would show a repeated note only once per place); other warnings
    are shown as usual."""
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImportNote)
        try:
            yield notes
        finally:
            others = []
            for w in caught:
                if issubclass(w.category, ImportNote):
                    if str(w.message) not in notes:
                        notes.append(str(w.message))
                else:
                    others.append(w)
    for w in others:  # re-emitted outside the recording block
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
