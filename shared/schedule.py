"""The Noam learning-rate schedule (paper section 5.3), defined once for both backends.

    lr(step) = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),   step counted from 1

It rises linearly for ``warmup`` steps, peaks at ``step == warmup`` with
``factor * d_model^-0.5 * warmup^-0.5`` and then decays as ``step^-0.5``. Step 0 is rejected rather
than silently returning 0 (the Annotated Transformer guards it with ``if step == 0: step = 1``).
"""
from __future__ import annotations

import sys

import numpy as np

from .checks import is_int, is_real, refusal
from .config import FLOAT32_MAX, FLOAT32_TINY
from .messages import shown


def noam_lr(step, d_model: int, warmup: int, factor: float = 1.0):
    """Learning rate at ``step`` (an int in [1, 2**53], or an integer array of them); float or float64
    array. Every int argument is at most 2**53, the last integer a float64 holds exactly."""
    for name, value in (("d_model", d_model), ("warmup", warmup)):
        if not is_int(value) or not 1 <= value <= 2**53:
            raise refusal(is_int(value))(f"noam_lr: {name} expected a positive int (at most 2**53, exact "
                                         f"as a float), got {shown(value)}")
    # Compared before any arithmetic: an int past float64's range (10**400) cannot be multiplied by
    # a float (Python's OverflowError), and inf or NaN is no rate.
    # NumPy's numbers too (np.float32(0.5)), as TransformerConfig takes them, compared and computed
    # as Python's (a float32 compared with float64's largest would overflow in the cast)
    value = (int(factor) if is_int(factor) else float(factor)) if is_real(factor) else None
    if value is None or not 0 < value <= sys.float_info.max:
        raise refusal(value is not None)(f"noam_lr: factor expected a positive float (at most "
                                         f"{sys.float_info.max:.4g}, a float64's largest), got {shown(factor)}")
    factor = float(value)
    peak = factor * d_model ** -0.5 * warmup ** -0.5  # the rate at step == warmup, the largest
    if not peak <= FLOAT32_MAX:  # a float32 update would overflow (torch raises, TF runs on inf)
        raise ValueError(f"noam_lr: factor expected a peak rate factor * d_model**-0.5 * warmup**-0.5 "
                         f"that float32 holds (<= {FLOAT32_MAX:.4g}), got factor={factor!r} "
                         f"(peak {peak:.4g})")
    # The rate the optimizers see is float32: a peak below its smallest normal rounds to a subnormal
    # or to 0 there, and `twins train --factor 1e-320` trained at a rate of exactly 0 (no weight
    # ever changed, exit 0).
    if not peak >= FLOAT32_TINY:
        raise ValueError(f"noam_lr: factor expected a peak rate factor * d_model**-0.5 * warmup**-0.5 "
                         f"that float32 holds as a normal number (>= {FLOAT32_TINY:.4g}), got "
                         f"factor={factor!r} (peak {peak:.4g})")
    steps = np.asarray(step)
    # NumPy holds an int past 2**64 as an object array: an int still, too large (ValueError), where
    # a float, a bool or a string is no step at all (TypeError).
    integers = steps.dtype.kind in "iu" or steps.dtype.kind == "O" and all(is_int(s) for s in steps.flat)
    if not integers or steps.size and not (steps.min() >= 1 and steps.max() <= 2**53):
        raise refusal(integers)(f"noam_lr: step expected an int in [1, 2**53] (steps are counted from 1, "
                                f"and are exact as a float64 up to 2**53), got {shown(step)}")
    lr = noam_formula(steps.astype(np.float64), d_model, warmup, factor)
    return float(lr) if lr.ndim == 0 else lr


def check_start_step(start_step) -> int:
    """The steps a resumed schedule has already taken: an int in ``[0, 2**53 - 1]``, so that its
    next step, ``start_step + 1``, is one `noam_lr` takes (both backends' schedules; before the
    bound, 10**5000 was refused as ``noam_lr: step``, naming the schedule's argument)."""
    if not is_int(start_step) or not 0 <= start_step <= 2**53 - 1:
        raise refusal(is_int(start_step))(f"start_step: expected an int in [0, 2**53 - 1] (the steps "
                                          f"already taken; the schedule's steps are exact as a float64 up "
                                          f"to 2**53), got {shown(start_step)}")
    return int(start_step)


def noam_formula(step, d_model: int, warmup: int, factor: float = 1.0, xp=np):
    """The formula alone, unchecked, for float ``step`` (>= 1) in the array library ``xp`` (NumPy, or
    ``tensorflow``: anything with ``minimum`` and ``sqrt``). Written once here so that a backend which
    computes the rate in its own graph (a Keras ``LearningRateSchedule`` inside ``tf.function``)
    evaluates the very same expression as `noam_lr`. ``step^-0.5`` is spelled ``1 / sqrt(step)``:
    IEEE square root and division are correctly rounded in every library, where ``pow`` is not, so
    both give the same float64 rate to the last bit."""
    return factor * d_model ** -0.5 * xp.minimum(1.0 / xp.sqrt(step), step * float(warmup) ** -1.5)
