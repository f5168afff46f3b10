"""Values as error messages show them.

Python refuses to turn an int of more than 4300 digits into text (``sys.set_int_max_str_digits``):
an f-string that formats one raises its own ``ValueError`` ("Exceeds the limit (4300 digits) for
integer string conversion"), so a message that quotes the bad value would hide the argument it
names. `shown` is the value as a message quotes it, with such an int shown by its sign and size.

A NumPy scalar is quoted with its type, as NumPy 2 writes it (``np.float64(1.0)``, ``np.True_``,
``np.str_('pre')``), on NumPy 1 too, whose ``repr`` is the bare value (``1.0``, ``True``,
``'pre'``): "expected an int, got 1.0" would not say that a NumPy float came, and the messages
would differ with the NumPy installed.
Imports nothing of the project (`shared.config` uses it).
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

# Ints of this many digits or more are shown by their size: a number that long is not read.
LONGEST_SHOWN = 100
# NumPy 1's repr of a NumPy scalar is the bare value; `shown` writes NumPy 2's form on it.
_NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


def shown(value, form: Callable[[object], str] = repr) -> str:
    """``form(value)`` (``repr`` by default; ``str`` where a message formats the value plainly),
    except an int of `LONGEST_SHOWN` digits or more: ``"an int of about 5,001 digits"`` (``"a
    negative int of ..."``), its digits counted by ``log10``, exact to one."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.timedelta64)):
        number = int(value)  # a timedelta64 is no number: int() of one with a unit is a timedelta
        if abs(number) >= 10 ** LONGEST_SHOWN:
            digits = math.floor(math.log10(abs(number))) + 1
            return f"{'a negative' if number < 0 else 'an'} int of about {digits:,} digits"
    if form is repr and not _NUMPY_2 and isinstance(value, np.generic):
        return _numpy_2_repr(value)
    return form(value)


def type_shown(value) -> str:
    """The type of ``value`` as a message names it: a built-in one by its name (``"NoneType"``,
    ``"dict"``), any other with its module (``"tf_impl.model.Transformer"``), so that a class is not
    taken for another of the same name (torch_impl's and tf_impl's ``Transformer``)."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _numpy_2_repr(value: np.generic) -> str:
    """NumPy 2's ``repr`` of a NumPy scalar, written on NumPy 1 (whose ``repr`` is the bare value
    for a bool, a number or a string): ``np.True_``, ``np.int64(3)``, ``np.float32(-0.5)``,
    ``np.complex128(1+2j)``, ``np.longdouble('1.5')``, ``np.str_('pre')``, ``np.bytes_(b'x')``,
    ``np.timedelta64(3,'s')`` (NumPy 1: ``numpy.timedelta64(3,'s')``). The number inside is
    NumPy's ``str`` of it, the shortest digits that read back (NumPy 1 writes a few large float32
    positionally, ``123456790.0`` for NumPy 2's ``1.2345679e+08``: the same number)."""
    name = type(value).__name__
    if isinstance(value, np.bool_):
        return f"np.{bool(value)}_"
    if isinstance(value, (np.str_, np.bytes_)):
        return f"np.{name}({value.item()!r})"
    if isinstance(value, np.timedelta64) or not isinstance(value, np.number):  # NumPy 1 names the module
        text = repr(value)
        return "np." + (text[len("numpy."):] if text.startswith("numpy.") else text)
    text = str(value)
    if isinstance(value, np.complexfloating) and text.startswith("("):
        text = text[1:-1]
    if isinstance(value, (np.longdouble, np.clongdouble)):  # more digits than a Python float holds
        return f"np.{name}('{text}')"
    return f"np.{name}({text})"
