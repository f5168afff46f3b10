"""The argument checks and result types of decoding (`shared.decoding`), shared verbatim by the
reference and both backends, so that every implementation raises the same error for the same bad
argument and returns the same arrays. `shared.decoding` re-exports every name here."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .checks import check_flag, is_int, is_real, refusal
from .config import FLOAT32_MAX, TransformerConfig  # a search runs in float32 at the narrowest
from .messages import shown


class GreedyResult(NamedTuple):
    """tokens (B, T) int64 without BOS, pad after EOS; log_probs (B, T), 0 after EOS; lengths (B,)
    = generated tokens including EOS."""
    tokens: np.ndarray
    log_probs: np.ndarray
    lengths: np.ndarray


class BeamResult(NamedTuple):
    """The best hypothesis per item: tokens (B, T), scores (B,) ranking scores, step_scores (B, T)
    per-token log-probs (0 after EOS), lengths (B,). With ``return_all``: the K best hypotheses,
    best first: all_tokens (B, K, T), all_scores (B, K), all_lengths (B, K); otherwise None. A slot
    no hypothesis reached (fewer than K possible ones) has score -inf, pad tokens and length 0."""
    tokens: np.ndarray
    scores: np.ndarray
    step_scores: np.ndarray
    lengths: np.ndarray
    all_tokens: np.ndarray | None = None
    all_scores: np.ndarray | None = None
    all_lengths: np.ndarray | None = None


def check_max_len(max_len, limit: int | None = None) -> None:
    """``max_len`` (new tokens, EOS included) is an int >= 1; with a model, the longest prefix fed
    (BOS + max_len - 1 tokens) must fit the positional table, so ``max_len <= config.max_len``."""
    if not is_int(max_len) or max_len < 1:
        raise refusal(is_int(max_len))(f"max_len: expected an int >= 1, got {shown(max_len)}")
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len: expected at most config.max_len={limit} (the positional table "
                         f"covers BOS plus max_len - 1 tokens), got {shown(max_len, str)}")


def check_beam_size(beam_size, vocab: int | None = None, name: str = "beam_size") -> None:
    """``beam_size`` is an int in [1, vocab - 1]: pad is never generated, so a beam has V - 1 children.
    ``name``: the argument as the caller's user wrote it (``--beam-size`` on the command line)."""
    if not is_int(beam_size) or beam_size < 1:
        raise refusal(is_int(beam_size))(f"{name}: expected an int >= 1, got {shown(beam_size)}")
    if vocab is not None and beam_size > vocab - 1:
        raise ValueError(f"{name}: expected at most tgt_vocab - 1 = {vocab - 1} (pad is never "
                         f"generated), got {shown(beam_size, str)}")


def check_length_penalty(alpha, max_len: int | None = None, name: str = "length_penalty",
                         max_len_name: str = "max_len") -> None:
    """``alpha`` is a finite real >= 0 (0 = no penalty); with ``max_len``, one whose largest
    penalty ``((5 + max_len) / 6) ** alpha`` is finite in float32: past that every finished score
    divides to zero and the ranking is lost (and a float64 power overflows later still, raising
    where a float32 one gives inf, so the backends would part). ``name``: the argument as the
    caller's user wrote it (``--length-penalty`` on the command line), ``max_len_name`` that of
    ``max_len`` (``--max-new``)."""
    real = is_real(alpha)
    try:
        finite = real and math.isfinite(float(alpha))
    except OverflowError:  # an int past float64's range (10**400)
        finite = False
    if not finite or alpha < 0:
        raise refusal(real)(f"{name}: expected a finite float >= 0 (GNMT alpha; 0 = none), got {shown(alpha)}")
    if max_len is not None and max_len > 1:
        # rounded down to 0.01: a float32 power a few ulps off at the very edge stays finite
        largest = math.floor(100 * math.log(FLOAT32_MAX) / math.log((5.0 + max_len) / 6.0)) / 100
        if alpha > largest:
            raise ValueError(f"{name}: expected at most {largest} at {max_len_name}={max_len} (the "
                             f"penalty ((5 + max_len) / 6) ** alpha must stay finite in float32), "
                             f"got {shown(alpha)}")


def check_flags(**flags) -> None:
    """The decoders' True/False arguments (``use_cache``, ``return_all``, ``compiled``; ``jit_compile``
    also None, "the default"), each refused by name unless a bool: ``return_all="no"`` was read for
    its truth and returned every hypothesis. Checked after the search arguments, before the mask,
    in all three implementations."""
    for name, value in flags.items():
        if name != "jit_compile":
            check_flag(value, name)
        elif value is not None and not isinstance(value, bool):
            try:
                check_flag(value, name)  # NumPy's bool passes
            except TypeError:
                raise TypeError(f"jit_compile: expected True, False or None (the measured default), "
                                f"got {shown(value)} ({type(value).__name__})") from None


class _Greedy:
    """The type of `GREEDY`."""

    def __repr__(self) -> str:
        return "GREEDY"


# The ``beam_size`` a greedy decoder passes to `check_search_args`: no beam to check. A value of
# its own, not None, so that a beam search given ``beam_size=None`` is refused as any other
# non-int is (``beam_size: expected an int >= 1, got None``), the same in every implementation.
GREEDY = _Greedy()


def check_search_args(config: TransformerConfig, max_len, beam_size=GREEDY, length_penalty=0.0,
                      max_len_name: str = "max_len") -> None:
    """All decoding arguments of a model-level API, in the fixed order (after the source checks):
    ``beam_size`` `GREEDY` for a greedy decoder, the beam search's argument as given otherwise.
    ``max_len_name``: ``max_len`` as the caller names it, in the length penalty's message."""
    check_max_len(max_len, config.max_len)
    if beam_size is not GREEDY:
        check_beam_size(beam_size, config.tgt_vocab)
    check_length_penalty(length_penalty, max_len, max_len_name=max_len_name)


def _check_ids(vocab: int, bos_id: int, eos_id: int, pad_id: int) -> None:
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if not is_int(value) or not 0 <= value < vocab:
            raise refusal(is_int(value))(f"{name}: expected an int in [0, {vocab}), got {shown(value)}")
    # bos_id is the start token of column 0 (a model's ``config.start_id``); it may be pad
    # (Marian's decoder_start_id), which the target mask then keeps (`shared.masks`). EOS may not:
    # an EOS equal to pad would make every finished row look live and vice versa.
    if pad_id == eos_id:
        raise ValueError(f"pad_id: expected an id different from eos_id, got {shown(pad_id, str)}")


def _check_batch(batch) -> None:
    if not is_int(batch) or batch < 1:
        raise refusal(is_int(batch))(f"batch: expected an int >= 1, got {shown(batch)}")


def _check_vocab(step) -> int:
    vocab = getattr(step, "vocab", None)
    if not is_int(vocab) or vocab < 2:
        raise refusal(is_int(vocab))(f"step.vocab: expected an int >= 2 (the width of the logits), got {shown(vocab)}")
    return int(vocab)


def _check_step(step, methods: tuple[str, ...]) -> None:
    """``step`` is callable and has the contract's ``methods`` (`shared.decoding.Step`)."""
    missing = [name for name in ("__call__",) + methods if not callable(getattr(step, name, None))]
    if missing:
        lacks = ", ".join(f"{name}()" for name in missing)
        raise TypeError(f"step: expected a Step (callable, with {' and '.join(f'{m}()' for m in methods)}), "
                        f"got {type(step).__name__} without {lacks}")


def _check_buffers(rows: int, max_len: int, vocab: int) -> None:
    """The search's buffers fit the machine: per row (batch x beams) two prefixes of 1 + T ids and
    two rows of T scores (alive and finished), and a step's V logits, 8 bytes a value (int64 and
    the oracle's float64), twice (a step's new copies). A step's own memory is the step's."""
    from .memory import exceeded
    rows, max_len, vocab = int(rows), int(max_len), int(vocab)  # NumPy's int32 would wrap the product
    need = 16 * rows * (4 * max_len + 2 + vocab)
    limit = exceeded(need)
    if limit is not None:
        raise ValueError(f"batch, max_len: the search's buffers for {rows:,} rows of {max_len:,} "
                         f"tokens (vocab {vocab:,}) need at least {need / 2**30:.1f} GiB, more than "
                         f"this machine's {limit / 2**30:.1f} GiB")


def check_greedy_args(step, batch, max_len, bos_id, eos_id, pad_id) -> tuple[int, int]:
    """The arguments of a greedy search, all before the first step (V is ``step.vocab``); the
    backends call this same function, so the errors are identical. Returns ``(batch, max_len)``
    as Python ints, which the search computes with: NumPy computes an int8 in int8, which wraps
    past 127, and meets a uint64 with an int64 in float64, which indexes nothing."""
    _check_step(step, ("initial_state",))
    _check_batch(batch)
    check_max_len(max_len)
    batch, max_len = int(batch), int(max_len)
    vocab = _check_vocab(step)
    _check_ids(vocab, bos_id, eos_id, pad_id)
    _check_buffers(batch, max_len, vocab)
    return batch, max_len


def check_beam_args(step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                    length_penalty) -> tuple[int, int, int]:
    """The arguments of a beam search, in this order, all before the first step. Returns ``(batch,
    max_len, beam_size)`` as Python ints (as `check_greedy_args`)."""
    _check_step(step, ("initial_state", "reorder"))
    _check_batch(batch)
    check_max_len(max_len)
    check_beam_size(beam_size)
    batch, max_len, beam_size = int(batch), int(max_len), int(beam_size)
    check_length_penalty(length_penalty, max_len)
    vocab = _check_vocab(step)
    _check_ids(vocab, bos_id, eos_id, pad_id)
    check_beam_size(beam_size, vocab)
    _check_buffers(batch * beam_size, max_len, vocab)
    return batch, max_len, beam_size


def step_output(returned) -> tuple:
    """What a step call returned, checked to be the contract's ``(logits, state)``."""
    if not (isinstance(returned, tuple) and len(returned) == 2):
        got = f"a tuple of {len(returned)}" if isinstance(returned, tuple) else type(returned).__name__
        raise TypeError(f"step: expected a tuple (logits, state), got {got}")
    return returned


def bad_step_message(t) -> str:
    """The error of a step whose logits a search cannot read, the same text everywhere."""
    return (f"step: expected logits without NaN or +inf, and a token other than pad above -inf, "
            f"in a live row (step {t})")


def candidates_per_beam(beam_size: int, vocab: int) -> int:
    """How many tokens each beam proposes in beam search: its ``2K`` best, or all ``V`` when fewer."""
    return min(2 * beam_size, vocab)
