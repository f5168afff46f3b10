"""The machinery every importer shares: the source state dict under import, the plan (expected
source key -> shape, and the canonical tensors computed from each key), every problem collected into
one `ImporterError`. NumPy only.

An importer converts or refuses; it never guesses. Whatever decides the computation and is *not*
stored in a state dict is a keyword argument of the importer, and whatever *is* stored is checked:
every key must be known and present with the shape the inferred sizes imply, every tensor must be
finite float of one dtype, and a positional encoding buffer must be the table the config implies.
All problems are reported together; nothing is returned partially.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, NamedTuple

import numpy as np

from ..checks import check_flag, is_int
from ..config import DTYPES, TransformerConfig
from ..messages import shown
from ..positional import positional_encoding
from ..weights import WeightsError, check_weights
from .near_miss import Renames, apply_renames, look_alike_hint

_LISTED = 30  # names listed per problem before "... and N more"
_EPS32 = float(np.finfo(np.float32).eps)
_BIASES = (".bias", ".in_proj_bias")


class ImporterError(WeightsError):
    """A source an importer refuses: every problem at once, in ``problems`` and the message; its
    settings' problems (``config.json: pad_token_id: ...``) as well as its tensors'."""

    subject = "the source"


def layer_indices(keys, prefix: str) -> list[int]:
    """The layer indices ``i`` of the keys ``{prefix}.{i}.*`` among ``keys``, sorted, once each."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
    return sorted({int(m.group(1)) for k in keys if (m := pattern.match(k))})


def _names(keys) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
    return f"{keys[:_LISTED]}{more}"


def _transpose(a: np.ndarray) -> np.ndarray:
    return a.T  # torch Linear stores (out, in); canonical kernels are (in, out): y = x @ kernel + bias


def _dtype_name(dtype) -> str | None:
    """``dtype``'s name where it is one of `DTYPES` without doubt: that name, or a NumPy dtype or
    type (``np.float32``); else None. Other spellings are refused: "float" and Python's ``float``
    are float64 to NumPy and float32 to torch (``torch.float``); "f8" or "double" the config refuses."""
    if isinstance(dtype, str):
        return dtype if dtype in DTYPES else None
    if dtype is float:
        return None
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        return None
    return name if name in DTYPES else None


class SourceImport:
    """The state dict under import, the problems found so far and the plan: expected source key ->
    shape, and the canonical tensors computed from each key."""

    def __init__(self, source: str, state_dict, dtype, allow_nonfinite: bool,
                 rename: Renames = None, buffers: Iterable[str] = ()):
        """``rename`` maps source key prefixes first (`apply_renames`); ``buffers`` are the keys of
        positional tables, which are checked against the config and never imported, so their dtype
        may differ from the weights' (a float32 model whose table was built in float64)."""
        check_flag(allow_nonfinite, "allow_nonfinite")
        self.source, self.problems = source, []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.outputs: dict[str, list[tuple[str, Callable[[np.ndarray], np.ndarray]]]] = {}
        self.buffers: set[str] = set()  # present keys checked elsewhere (positional tables)
        self.ignored: set[str] = set()  # present keys the source model holds but never computes with
        self.named: set[str] = set()  # keys a size was read from, or asked of (`size`)
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"{source}: state_dict expected a dict of name -> numpy array, "
                            f"got {type(state_dict).__name__}")
        odd = [k for k in state_dict if not isinstance(k, str)]
        if odd:
            raise TypeError(f"{source}: state_dict keys expected str, got {odd[:_LISTED]!r}")
        self.sd, problems = apply_renames(dict(state_dict), rename)
        self.problems.extend(problems)
        self.dtype = self._check_arrays(dtype, allow_nonfinite, set(buffers))

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _check_arrays(self, dtype, allow_nonfinite: bool, buffers: set[str]) -> str | None:
        by_dtype: dict[str, list[str]] = {}
        for key, value in self.sd.items():
            if not isinstance(value, np.ndarray):
                self.problem(f"{key}: expected a numpy array, got {type(value).__name__} "
                             "(convert torch tensors with .detach().cpu().numpy())")
            elif value.dtype.kind != "f":
                self.problem(f"{key}: expected a floating-point tensor, got dtype {value.dtype}")
            else:
                if key not in buffers:  # a checked-only table may have its own dtype
                    by_dtype.setdefault(str(value.dtype), []).append(key)
                if not allow_nonfinite and not np.isfinite(value).all():
                    self.problem(f"{key}: contains NaN or Inf")
        if len(by_dtype) > 1:
            listed = "; ".join(f"{d}: {_names(k)}" for d, k in sorted(by_dtype.items()))
            self.problem(f"mixed dtypes (expected one float dtype for every tensor): {listed}")
        if dtype is not None:
            name = _dtype_name(dtype)
            if name is None:
                self.problem(f"dtype: expected one of {DTYPES} or None, got {shown(dtype)}")
            return name
        if len(by_dtype) == 1:
            (found,) = by_dtype
            if found in DTYPES:
                return found
            self.problem(f"source dtype {found}: pass dtype='float32' or 'float64' to convert it "
                         "explicitly (the canonical model computes in float32 or float64)")
        return None

    # -- sizes ------------------------------------------------------------------------------------
    def size(self, what: str, candidates: list[tuple[str, int]]) -> int | None:
        """A size read from the first candidate ``(key, axis)`` present with that axis. Where none
        is, the hint's look-alikes are the keys no size was to be read from: a key the format names
        (``tgt_tok_emb...`` while ``src_tok_emb...`` is missing) is in use, not a renamed one."""
        self.named.update(key for key, _ in candidates)
        for key, axis in candidates:
            value = self.sd.get(key)
            if isinstance(value, np.ndarray) and value.ndim > axis:
                return int(value.shape[axis])
        self.problem(f"cannot infer {what}: none of {[k for k, _ in candidates]} is present")
        hint = look_alike_hint([k for k, _ in candidates], [k for k in self.sd if k not in self.named])
        if hint and hint not in self.problems:
            self.problem(hint)
        return None

    def layer_count(self, prefix: str) -> int:
        found = layer_indices(self.sd, prefix)
        if not found:
            self.problem(f"no layers: expected keys {prefix}.0.*")
            return 0
        return self.planned_layers(f"{prefix}.*", found, prefix=prefix)  # a gap: missing keys of that layer

    def planned_layers(self, what: str, held, declared: int | None = None, declared_by: str = "",
                       prefix: str | None = None) -> int:
        """How many layers of a stack to expect: ``declared`` (what ``declared_by``, a config's
        key, says), else one past the highest index ``held``. An import plans at most twice the
        layers the weights hold, so a config's 10**6 layers, or one stray index 999999, is one
        problem and none planned (0), not a plan of a million layers (the keys ``{prefix}.*`` of
        the stack are then not listed again as unexpected); a smaller shortfall is planned, so that
        each missing key is named."""
        held = sorted(set(held))
        wanted = declared if declared is not None else (held[-1] + 1 if held else 0)
        if wanted <= 2 * len(held):
            return wanted
        first = ", ".join(map(str, held[:8])) + (", ..." if len(held) > 8 else "")
        asked = f"{declared_by} is {wanted}" if declared is not None else f"layer indices up to {wanted - 1}"
        self.problem(f"{what}: {asked}, but the weights hold {len(held)} layer(s) ({first or 'none'}); "
                     "not planned (an import plans at most twice the layers it holds)")
        if prefix is not None:
            self.ignored.update(k for k in self.sd if k.startswith(f"{prefix}."))
        return 0

    # -- plan -------------------------------------------------------------------------------------
    def expect(self, key: str, shape: tuple[int, ...], *outputs) -> None:
        self.shapes[key] = shape
        self.outputs[key] = list(outputs)

    def linear(self, src: str, dst: str, n_in: int, n_out: int) -> None:
        self.expect(f"{src}.weight", (n_out, n_in), (f"{dst}.kernel", _transpose))
        self.expect(f"{src}.bias", (n_out,), (f"{dst}.bias", np.asarray))

    def norm(self, src: str, dst: str, d: int, gain: str, offset: str) -> None:
        self.expect(f"{src}.{gain}", (d,), (f"{dst}.gamma", np.asarray))
        self.expect(f"{src}.{offset}", (d,), (f"{dst}.beta", np.asarray))

    def hint_layout(self, hints: list[tuple[Callable[[str], bool], str]]) -> None:
        """Name the right importer when keys of another layout are given."""
        for applies, text in hints:
            if any(applies(k) for k in self.sd):
                self.problem(text)

    def check_keys(self, bias_hint: str) -> None:
        missing = [k for k in self.shapes if k not in self.sd]
        unexpected = [k for k in self.sd
                      if k not in self.shapes and k not in self.buffers and k not in self.ignored]
        if missing:
            self.problem(f"missing keys: {_names(missing)}")
        if unexpected:
            self.problem(f"unexpected keys: {_names(unexpected)}")
        if missing and unexpected and (hint := look_alike_hint(missing, unexpected)):
            self.problem(hint)
        biases = [k for k in self.shapes if k.endswith(_BIASES)]
        if missing and all(k.endswith(_BIASES) for k in missing) and 2 * len(missing) >= len(biases):
            self.problem(bias_hint)
        for key, shape in self.shapes.items():
            value = self.sd.get(key)
            if isinstance(value, np.ndarray) and value.shape != shape:
                self.problem(f"{key}: expected shape {shape}, got {value.shape}")

    def positional(self, keys: list[str], max_len: int | None, d: int | None,
                   expected: "ExpectedTable | None" = None) -> int | None:
        """Check the positional tables present among ``keys``; return the max_len they imply.

        ``expected`` describes the table (default: the interleaved paper table from position 0,
        `INTERLEAVED`); the rows a source keeps besides the ``max_len`` usable ones (fairseq's,
        below its first position) are counted by ``expected.extra_rows``."""
        expected = expected or INTERLEAVED
        lengths = []
        for key in keys:
            value = self.sd.get(key)
            if key not in self.sd:
                continue
            self.buffers.add(key)
            if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or d is None:
                continue  # already reported
            table = _squeeze_table(value)
            if table is None or table.shape[1] != d or table.shape[0] <= expected.extra_rows:
                self.problem(f"{key}: expected a positional table of shape (max_len, 1, {d}), "
                             f"(1, max_len, {d}) or (max_len, {d}), got {value.shape}")
                continue
            bad = _first_differing_row(table, expected)
            if bad is not None:
                self.problem(
                    f"{key}: not {expected.describe}; row {bad} differs. Another layout (e.g. "
                    "concatenated [sin | cos], other frequencies or offsets, a learned table) "
                    "would compute differently; refusing")
                continue
            lengths.append(table.shape[0] - expected.extra_rows)
        if not lengths:
            if max_len is None and not any(k in self.sd for k in keys):
                self.problem(f"no positional table ({' / '.join(keys)}): pass max_len to declare "
                             f"that the model adds {expected.describe} (e.g. from a "
                             "non-persistent buffer); refusing to assume it")
            return max_len
        implied = min(lengths)  # the source cannot run longer sequences than its shortest table
        if max_len is not None and max_len > implied:
            self.problem(f"max_len: expected at most {implied} (the stored positional table), "
                         f"got {max_len}")
        return implied if max_len is None else max_len

    def config(self, sources: Mapping[str, str] | None = None, **fields) -> TransformerConfig | None:
        """The `TransformerConfig` of ``fields``, or None with the problem recorded. ``sources``:
        config field -> the source setting it came from, as the user knows it (``"config.json:
        max_position_embeddings"``); a field the config refuses is reported under that name."""
        if self.problems:
            return None
        try:
            return TransformerConfig(**fields)
        except ValueError as err:
            text = str(err)
            field, _, rest = text.partition(": ")
            name = field.removeprefix("TransformerConfig.")
            if field.startswith("TransformerConfig.") and name in (sources or {}):
                text = f"{sources[name]}: {rest} (as TransformerConfig.{name})"
            self.problem(text)
            return None

    def finish(self, config: TransformerConfig | None) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
        if self.problems or config is None:
            raise ImporterError(self.source, self.problems)
        weights: dict[str, np.ndarray] = {}
        for key, outputs in self.outputs.items():
            for name, fn in outputs:
                # A copy: the result never aliases the caller's arrays.
                weights[name] = np.array(fn(self.sd[key]), dtype=self.dtype, order="C", copy=True)
        check_weights(config, weights, source=self.source, allow_nonfinite=True)  # invariant
        return config, weights


def _squeeze_table(value: np.ndarray) -> np.ndarray | None:
    if value.ndim == 2:
        return value
    if value.ndim == 3 and value.shape[1] == 1:
        return value[:, 0, :]  # (max_len, 1, d): the tutorial's seq-first buffer
    if value.ndim == 3 and value.shape[0] == 1:
        return value[0]  # (1, max_len, d): batch-first buffers (Annotated Transformer)
    return None


class ExpectedTable(NamedTuple):
    """The sinusoidal table a source stores, in `shared.positional` terms: row ``r`` of the stored
    table is position ``r`` (offset 0), except ``zero_row`` (fairseq's padding row, all zeros)."""
    layout: str = "interleaved"
    timescale: str = "paper"
    zero_row: int | None = None
    extra_rows: int = 0  # rows before the first usable position (fairseq: pad_id + 1)
    describe: str = ("the interleaved sinusoidal table (PE[p, 2i] = sin, PE[p, 2i+1] = cos of "
                     "p / 10000^(2i/d), p from 0)")

    def table(self, rows: int, d: int) -> np.ndarray:
        out = positional_encoding(rows, d, self.layout, self.timescale)
        if self.zero_row is not None and self.zero_row < rows:
            out[self.zero_row] = 0.0
        return out


INTERLEAVED = ExpectedTable()


def _first_differing_row(table: np.ndarray, expected: ExpectedTable) -> int | None:
    """The first row that is not the expected table up to the buffer's rounding, or None.

    A table built in float32 carries an angle error of a few ulps of ``p * frequency`` (<= p): at
    most 8e-8 * p was measured for max_len 5000 and d up to 1024. Row p may differ by
    8 * eps * (1 + p) (12 times that), eps that of the buffer's dtype but at least float32's: a
    float64 buffer is often a float32 one cast by ``model.double()`` (transformers builds Marian's
    and fairseq's tables through float32 even in a float64 model). Another layout differs by O(1)
    within the first rows."""
    eps = max(float(np.finfo(table.dtype).eps), _EPS32)
    if table.shape[1] % 2 and expected.layout == "halves":
        return 0  # no [sin | cos] table of odd width in shared.positional: refused
    if expected.timescale == "t2t" and (table.shape[1] % 2 or table.shape[1] < 4):
        return 0
    reference = expected.table(table.shape[0], table.shape[1])
    rows = np.abs(table.astype(np.float64) - reference).max(axis=1)
    allowed = 8 * eps * (1.0 + np.arange(table.shape[0]))
    bad = np.flatnonzero(~(rows <= allowed))
    return int(bad[0]) if bad.size else None


def n_heads_problem(n_heads, d: int | None) -> str | None:
    if not is_int(n_heads) or n_heads < 1:
        return f"n_heads: expected a positive int, got {n_heads!r}"
    if d is not None and d % n_heads:
        return f"n_heads: expected a divisor of d_model={d}, got {n_heads}"
    return None
