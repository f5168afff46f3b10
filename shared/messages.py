"""Values as error messages show them.

Python refuses to turn an int of more than 4300 digits into text (``sys.set_int_max_str_digits``):
an f-string that formats one raises its own ``ValueError`` ("Exceeds the limit (4300 digits) for
integer string conversion"), so a message that quotes the bad value would hide the argument it
names. `shown` is the value as a message quotes it, with such an int shown by its sign and size.
Imports nothing of the project (`shared.config` uses it).
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

# Ints of this many digits or more are shown by their size: a number that long is not read.
LONGEST_SHOWN = 100


def shown(value, form: Callable[[object], str] = repr) -> str:
    """``form(value)`` (``repr`` by default; ``str`` where a message formats the value plainly),
    except an int of `LONGEST_SHOWN` digits or more: ``"an int of about 5,001 digits"`` (``"a
    negative int of ..."``), its digits counted by ``log10``, exact to one."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if abs(number) >= 10 ** LONGEST_SHOWN:
            digits = math.floor(math.log10(abs(number))) + 1
            return f"{'a negative' if number < 0 else 'an'} int of about {digits:,} digits"
    return form(value)


def type_shown(value) -> str:
    """The type of ``value`` as a message names it: a built-in one by its name (``"NoneType"``,
    ``"dict"``), any other with its module (``"tf_impl.model.Transformer"``), so that a class is not
    taken for another of the same name (torch_impl's and tf_impl's ``Transformer``)."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
