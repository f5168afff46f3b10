"""Near-miss layouts: a source whose modules were renamed. NumPy-free string work.

`apply_renames` maps key prefixes (``rename={OLD: NEW}``, `twins convert --rename OLD=NEW`) before an
importer reads the keys; `look_alike_hint` names, when keys are missing, the unexpected keys that
look like them and the renames that would map them.
"""
from __future__ import annotations

import difflib
from typing import Mapping, Sequence, Union

Renames = Union[Mapping[str, str], Sequence[tuple[str, str]], None]


def parse_renames(rename: Renames) -> list[tuple[str, str]]:
    """``{OLD: NEW}`` or ``[(OLD, NEW), ...]`` (key prefixes) as a list; a bad entry is a TypeError."""
    if rename is None:
        return []
    # a str or a lone pair iterates too, into characters or strings: named as the whole it is
    lone_pair = isinstance(rename, tuple) and len(rename) == 2 and all(isinstance(p, str) for p in rename)
    if lone_pair or isinstance(rename, (str, bytes)) or not isinstance(rename, (Mapping, Sequence)):
        raise TypeError(f"rename: expected {{OLD: NEW}} or [(OLD, NEW), ...] of str key prefixes, "
                        f"got {type(rename).__name__} {rename!r}"[:300])
    pairs = list(rename.items()) if isinstance(rename, Mapping) else list(rename)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise TypeError(f"rename: expected {{OLD: NEW}} or [(OLD, NEW), ...] of str key prefixes, "
                            f"got the entry {pair!r}")
    olds = [old for old, _ in pairs]
    twice = sorted({old for old in olds if olds.count(old) > 1})
    if twice:  # one would win silently: the longest-prefix rule cannot choose between equals
        raise ValueError(f"rename: expected each OLD prefix once, got {twice[0]!r} "
                         f"{olds.count(twice[0])} times")
    return pairs


def apply_renames(state_dict: dict, rename: Renames) -> tuple[dict, list[str]]:
    """Replace each key's prefix ``OLD`` by ``NEW`` (the longest matching ``OLD`` wins; ``""``
    matches every key, to add a prefix). Returns ``(renamed dict, problems)``: a rename that
    matches no key, and two keys renamed onto one name, are problems, never silently dropped."""
    pairs = sorted(parse_renames(rename), key=lambda p: -len(p[0]))
    if not pairs:
        return state_dict, []
    out: dict = {}
    sources: dict[str, str] = {}
    used: set[str] = set()
    problems = []
    for key, value in state_dict.items():
        new = key
        for old, replacement in pairs:
            if key.startswith(old):
                new = replacement + key[len(old):]
                used.add(old)
                break
        if new in out:
            problems.append(f"rename: {sources[new]!r} and {key!r} both become {new!r}")
            continue
        out[new], sources[new] = value, key
    for old, replacement in pairs:
        if old not in used:
            problems.append(f"rename {old!r} -> {replacement!r}: no key starts with {old!r}")
    return out, problems


def _split_common_suffix(a: str, b: str) -> tuple[str, str]:
    """The parts of two dotted keys before their longest common suffix of whole components."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    head_a, head_b = ".".join(pa[: len(pa) - n]), ".".join(pb[: len(pb) - n])
    return (head_a + "." if head_a else ""), (head_b + "." if head_b else "")


def look_alike_hint(missing: list[str], unexpected: list[str]) -> str | None:
    """A hint naming, for missing keys, the unexpected keys that look like them (same last
    component, most similar name), and the ``rename`` prefixes that would map one onto the other."""
    pairs: list[tuple[str, str]] = []
    for m in missing:
        last = m.rsplit(".", 1)[-1]
        candidates = [u for u in unexpected if u.rsplit(".", 1)[-1] == last]
        if not candidates:
            continue
        best = max(candidates, key=lambda u: (difflib.SequenceMatcher(None, u, m).ratio(), u))
        if difflib.SequenceMatcher(None, best, m).ratio() >= 0.6:
            pairs.append((best, m))
    if not pairs:
        return None
    renames: dict[tuple[str, str], int] = {}
    for u, m in pairs:
        old, new = _split_common_suffix(u, m)
        if old != new:
            renames[(old, new)] = renames.get((old, new), 0) + 1
    shown = "; ".join(f"{u!r} for {m!r}" for u, m in pairs[:8])
    more = f" ... and {len(pairs) - 8} more" if len(pairs) > 8 else ""
    text = f"hint: unexpected keys that look like missing ones: {shown}{more}"
    if renames:
        best = sorted(renames.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
        text += ("; if the modules were only renamed, map the prefixes: rename="
                 + repr({old: new for (old, new), _ in best})
                 + " (twins convert: " + " ".join(f"--rename {old}={new}" for (old, new), _ in best) + ")")
    return text
