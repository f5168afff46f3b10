"""Label-smoothed cross-entropy, the NumPy float64 reference of the training loss
(docs/design.md, convention 14).

The smoothed target is ``(1 - eps) * onehot + eps / V`` (the convention PyTorch's
``cross_entropy(label_smoothing=eps)`` and Keras's ``CategoricalCrossentropy(label_smoothing=eps)``
share); positions whose target is ``pad_id`` carry no loss, and the loss is the mean over the
non-padding positions. (The Annotated Transformer instead spreads ``eps`` over ``V - 2`` classes,
excluding the true class and padding, and sums; that is a different number.)
"""
from __future__ import annotations


import numpy as np

from .checks import as_array, dtype_name, ids_array, ids_range_message, is_int, is_real, refusal
from .messages import shown


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Stable log-softmax over the last axis, float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def label_smoothed_cross_entropy(logits: np.ndarray, targets: np.ndarray, pad_id: int,
                                 smoothing: float = 0.0) -> float:
    """Mean smoothed cross-entropy over non-padding positions.

    Args:
        logits: (B, T, V) scores (not log-probabilities).
        targets: (B, T) integer ids; ``pad_id`` positions are ignored.
        smoothing: eps in [0, 1).

    Raises ``ValueError`` when no target is left to average (all padding, ``B = 0`` or ``T = 0``:
    `check_some_targets`), as both backends' losses do.
    """
    logits, targets = as_array("logits", logits), ids_array("targets", targets)
    check_loss_args("label_smoothed_cross_entropy", logits.shape, targets.shape, dtype_name(targets),
                    targets.dtype.kind in "iu", smoothing, dtype_name(logits), logits.dtype.kind == "f",
                    pad_id)
    logits = logits.astype(np.float64)
    vocab = logits.shape[-1]
    if targets.size:  # before any indexing: NumPy would wrap -1 to the last class
        check_targets_range(vocab, int(targets.min()), int(targets.max()))
    keep = targets != pad_id
    check_some_targets(bool(keep.any()))
    logp = log_softmax(logits)[keep]  # (N, V)
    picked = logp[np.arange(logp.shape[0]), targets[keep]]
    per_token = -(1.0 - smoothing) * picked - smoothing / vocab * logp.sum(axis=-1)
    return float(per_token.mean())


def check_loss_args(caller: str, logits_shape, targets_shape, targets_dtype: str,
                    targets_is_integer: bool, smoothing: float, logits_dtype: str,
                    logits_is_floating: bool, pad_id) -> None:
    """The loss's argument checks on metadata only, so the NumPy reference and both backends' built-in
    losses reject a bad call with the same message (a flattened framework loss would otherwise accept
    targets of the wrong shape whenever the element counts happen to match). Dtypes are named as
    NumPy names them (``float32``, not ``torch.float32``)."""
    logits_shape, targets_shape = tuple(logits_shape), tuple(targets_shape)
    if len(logits_shape) != 3 or targets_shape != logits_shape[:2]:
        raise ValueError(f"{caller}: expected logits (B, T, V) and targets (B, T), "
                         f"got {logits_shape} and {targets_shape}")
    if not logits_is_floating:
        raise TypeError(f"logits: expected floating-point scores, got dtype {logits_dtype}")
    if not targets_is_integer:
        raise TypeError(f"targets: expected integer ids, got dtype {targets_dtype}")
    if not is_int(pad_id):
        raise TypeError(f"pad_id: expected an int (the id whose targets carry no loss), got {shown(pad_id)}")
    if not -2**63 <= pad_id < 2**63:  # torch's ignore_index and TensorFlow's constants are int64
        raise ValueError(f"pad_id: expected an int64 (the id whose targets carry no loss), got "
                         f"{shown(pad_id, str)}")
    check_smoothing(smoothing)


def check_tokens(tokens) -> None:
    """A loss's ``tokens``, the count its sum is divided by (a data-parallel share's: the global
    batch's non-padding targets): None (the mean over the targets given), or an int in [1, 2**53]
    (exact as a float). Not a float: a count; 0 made the loss inf, -1 negative, NaN NaN. A
    framework's tensor, as a data-parallel engine computes it inside its step, is its caller's."""
    if tokens is None:
        return
    if not is_int(tokens):
        raise TypeError(f"tokens: expected an int >= 1 (the non-padding targets to divide by), got "
                        f"{shown(tokens)}")
    if not 1 <= tokens <= 2**53:
        raise ValueError(f"tokens: expected an int in [1, 2**53] (the non-padding targets to divide "
                         f"by), got {shown(tokens, str)}")


def targets_range_message(vocab, lo, hi) -> str:
    """The one message for a target id outside ``[0, vocab)`` (sizes may be ``"{}"`` placeholders,
    filled at run time by TensorFlow's graph-mode assertion)."""
    return ids_range_message("targets", vocab, lo, hi)


def check_targets_range(vocab: int, lo: int, hi: int) -> None:
    """Every target id in ``[0, vocab)`` (pad included; its position carries no loss): else the
    reference would wrap -1 to the last class, TF's one-hot give a zero row, torch an IndexError."""
    if lo < 0 or hi >= vocab:
        raise ValueError(targets_range_message(vocab, lo, hi))


# The loss is a mean over the non-padding targets: over none (every target padding, no rows or no
# columns) it is 0 / 0, a NaN that a backward pass spreads into every weight without a word.
NO_TARGETS = "targets: expected at least one non-padding position, got only padding"


def check_some_targets(any_target: bool) -> None:
    """At least one target is not padding (the reference and both backends' losses, unless a
    data-parallel share divides by the global batch's count)."""
    if not any_target:
        raise ValueError(NO_TARGETS)


def check_smoothing(smoothing: float) -> None:
    """Label smoothing eps must be a number in [0, 1). The message shows the value as ``repr``
    writes it, with its type: str() showed the string ``"0.5"`` as 0.5, a value in range."""
    if not is_real(smoothing) or not 0.0 <= smoothing < 1.0:
        raise refusal(is_real(smoothing))(f"smoothing: expected a value in [0, 1), got {shown(smoothing)} "
                                          f"({type(smoothing).__name__})")
