"""The two demo tasks of the project's sources, as framework-free NumPy data.

* **copy**: the Annotated Transformer's first experiment: the target is the source, token for token.
* **dates**: normalise a human-readable English date (``"sat 2 feb 2019"``, ``"2/2/19"``,
  ``"saturday february 2 2019"``...) to ISO ``yyyy-mm-dd``, from a PyTorch demo that draws the
  formats with babel (CLDR's short, medium, long and full date formats plus custom patterns).

Both tasks use one fixed character vocabulary (`VOCAB`), so a checkpoint trained in one process
decodes in another without shipping a vocabulary file. Sequences are batched as

    src      (B, S)  the tokens, then padding
    tgt_in   (B, T)  BOS, the target tokens, then padding       (decoder input)
    tgt_out  (B, T)  the target tokens, EOS, then padding       (what the loss predicts)

Dates are drawn from 1970-01-01 to 2069-12-31: in that window a two-digit year (the short
format "M/d/yy") still names one century, so every source has exactly one correct answer.
(The source demo's "Y" pattern is the ISO week-based year, which differs from the calendar year
around New Year; here the calendar year "y" is used.)
"""
from __future__ import annotations

import datetime as _dt
import string
from dataclasses import dataclass

import numpy as np

from .checks import is_int, refusal
from .config import INT64_MAX
from . import memory
from .messages import shown

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
CHARS = string.digits + string.ascii_lowercase + " -./"
VOCAB: tuple[str, ...] = SPECIALS + tuple(CHARS)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
_INDEX = {token: i for i, token in enumerate(VOCAB)}

COPY_SYMBOLS = 10  # the Annotated Transformer copies sequences of symbols 1..10
COPY_VOCAB = len(SPECIALS) + COPY_SYMBOLS
COPY_LENGTH = 10


def encode_text(text: str) -> list[int]:
    """Characters -> ids (unknown characters -> ``<unk>``)."""
    return [_INDEX.get(ch, UNK_ID) for ch in text]


def decode_text(ids) -> str:
    """Ids -> text, stopping at EOS and skipping padding and BOS."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS_ID:
            break
        if i in (PAD_ID, BOS_ID):
            continue
        out.append(VOCAB[i] if 0 <= i < len(VOCAB) and i >= len(SPECIALS) else UNK)
    return "".join(out)


def batch_sequences(sources: list[list[int]], targets: list[list[int]], start_id: int = BOS_ID
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad lists of id lists into ``(src, tgt_in, tgt_out)`` int64 arrays (see the module docstring).
    ``tgt_in`` starts with ``start_id``: a model's ``config.start_id``, the token decoding starts from."""
    if len(sources) != len(targets) or not sources:
        raise ValueError(f"batch_sequences: expected equal, non-zero numbers of sources and targets, "
                         f"got {len(sources)} and {len(targets)}")
    s_len = max(len(s) for s in sources)
    t_len = max(len(t) for t in targets) + 1
    src = np.full((len(sources), s_len), PAD_ID, dtype=np.int64)
    tgt_in = np.full((len(sources), t_len), PAD_ID, dtype=np.int64)
    tgt_out = np.full((len(sources), t_len), PAD_ID, dtype=np.int64)
    for b, (s, t) in enumerate(zip(sources, targets)):
        src[b, : len(s)] = s
        tgt_in[b, : len(t) + 1] = [start_id, *t]
        tgt_out[b, : len(t) + 1] = [*t, EOS_ID]
    return src, tgt_in, tgt_out


# The least an example costs as Python objects: its pair (a tuple, 56 bytes) and its source and
# target (a list or str, 56 bytes each before their contents).
EXAMPLE_BYTES = 3 * 56


def _check_draw(n, seed) -> None:
    """A count of examples and a seed, before anything is drawn: an int >= 0 or a list of them
    (NumPy's entropy for a stream of its own: `twins.demo_tasks` draws step ``s`` of a run seeded
    ``r`` with ``[r, s]``); None would draw fresh entropy where the examples are promised
    deterministic in their seed (`check_seed`)."""
    if not is_int(n) or not 0 <= n <= INT64_MAX:
        raise refusal(is_int(n))(f"n: expected an int in [0, 2**63 - 1], got {shown(n)}")
    limit = memory.exceeded(n * EXAMPLE_BYTES)
    if limit is not None:  # refused by name, not by NumPy or a MemoryError
        raise ValueError(f"n: {n} examples need at least {n * EXAMPLE_BYTES / 2**30:,.1f} GiB as Python "
                         f"objects ({EXAMPLE_BYTES} bytes each at the least), more than this machine's "
                         f"{limit / 2**30:.1f} GiB")
    for part in (seed if isinstance(seed, (list, tuple)) and seed else [seed]):
        if not is_int(part) or part < 0:
            raise refusal(is_int(part))(f"seed: expected an int >= 0 or a list of them, got {shown(seed)}")


# -- copy -----------------------------------------------------------------------------------------
def copy_examples(n: int, seed: int, length: int = COPY_LENGTH) -> list[tuple[list[int], list[int]]]:
    """``n`` (source, target) pairs of ``length`` random symbols each; the target equals the source."""
    _check_draw(n, seed)
    if not is_int(length) or not 1 <= length <= INT64_MAX:
        raise refusal(is_int(length))(f"length: expected an int in [1, 2**63 - 1], got {shown(length)}")
    limit = memory.exceeded(16 * n * length)  # two lists of 8-byte slots an example
    if limit is not None:
        raise ValueError(f"n, length: {n} examples of {length} symbols need at least "
                         f"{16 * n * length / 2**30:,.1f} GiB, more than this machine's "
                         f"{limit / 2**30:.1f} GiB")
    rng = np.random.default_rng(seed)
    symbols = rng.integers(len(SPECIALS), COPY_VOCAB, size=(n, length))
    return [(row.tolist(), row.tolist()) for row in symbols]


# -- dates ----------------------------------------------------------------------------------------
BUILTIN_FORMATS = ("short", "medium", "long", "full")  # CLDR en_US: M/d/yy, MMM d y, MMMM d y, EEEE MMMM d y
BUILTIN_WEIGHTS = (0.2, 0.2, 0.2, 0.4)
# Custom patterns, each with whether its month may be numeric. The source demo mixes "{m} {d} {y}"
# with "{d} {m} {y}" and two-digit years in "{y}/{m}/{d}", so "3 4 2019" or "12/03/04" had two
# right answers; here a day-first pattern spells its month and custom years have four digits.
CUSTOM_PATTERNS = (("{m}/{d}/{y}", True), ("{y}/{m}/{d}", True), ("{m} {d} {y}", True),
                   ("{y}.{m}.{d}", True), ("{d} {m} {y}", False), ("{y} {d} {m}", False),
                   ("{e} {d} {m} {y}", False))
YEAR_FORMATS = ("y", "yyyy")
NUMERIC_MONTHS, NAMED_MONTHS = ("M", "MM"), ("MMM", "MMMM")
DAY_FORMATS = ("d", "dd")
WEEKDAY_FORMATS = ("EEE", "EEEE")
FIRST_DAY, LAST_DAY = _dt.date(1970, 1, 1), _dt.date(2069, 12, 31)


def _date_pattern(rng: np.random.Generator, builtin_ratio: float = 0.8) -> str:
    if rng.random() < builtin_ratio:
        return str(rng.choice(BUILTIN_FORMATS, p=BUILTIN_WEIGHTS))
    pattern, numeric_month = CUSTOM_PATTERNS[rng.integers(len(CUSTOM_PATTERNS))]
    pick = lambda options: options[rng.integers(len(options))]  # noqa: E731
    months = NUMERIC_MONTHS + NAMED_MONTHS if numeric_month else NAMED_MONTHS
    return pattern.format(y=pick(YEAR_FORMATS), m=pick(months), d=pick(DAY_FORMATS),
                          e=pick(WEEKDAY_FORMATS))


def date_examples(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (human-readable, ISO) date pairs, deterministic in ``seed``. Needs the ``babel`` package."""
    try:
        from babel.dates import format_date
    except ImportError as err:  # babel is the `demo` extra
        raise ImportError("the dates task needs babel: pip install 'twin-transformer[demo]'") from err
    _check_draw(n, seed)
    rng = np.random.default_rng(seed)
    span = (LAST_DAY - FIRST_DAY).days + 1
    out = []
    for _ in range(n):
        date = FIRST_DAY + _dt.timedelta(days=int(rng.integers(span)))
        human = format_date(date, format=_date_pattern(rng), locale="en_US")
        human = " ".join(human.lower().replace(",", "").split())  # babel may use narrow spaces
        out.append((human, date.isoformat()))
    return out


@dataclass(frozen=True)
class TaskData:
    """Examples of one task as id lists, plus the texts when the task has them."""
    sources: list[list[int]]
    targets: list[list[int]]
    texts: list[tuple[str, str]] | None = None


def make_task(task: str, n: int, seed: int) -> TaskData:
    """``n`` examples of ``task`` ("copy" or "dates")."""
    if task == "copy":
        pairs = copy_examples(n, seed)
        return TaskData([s for s, _ in pairs], [t for _, t in pairs])
    if task == "dates":
        texts = date_examples(n, seed)
        return TaskData([encode_text(h) for h, _ in texts], [encode_text(d) for _, d in texts], texts)
    raise ValueError(f"task: expected 'copy' or 'dates', got {task!r}")
