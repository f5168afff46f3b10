"""Checks of the training step's inputs shared by both backends' ``train_step`` and ``gradients``
(NumPy only), so that a bad batch fails with the same type and text in torch_impl and tf_impl
(docs/design.md: the checks are written once, in shared/). The loss's own checks are in
`shared.loss`.
"""
from __future__ import annotations

import math

import numpy as np

from .checks import check_ids, dtype_name, ids_array
from .messages import shown


def batch_ids(name: str, value) -> np.ndarray:
    """A batch's ids (``src``, ``tgt`` or ``tgt_out``) that are not a framework's tensor, as a
    NumPy array of numbers (`shared.checks.ids_array`: ragged rows, None and objects refused), text
    refused here (shape first, then dtype, as `shared.checks.check_ids` orders them) because torch
    cannot hold it and TensorFlow would hold it until a later check. The backend converts the
    array and checks its values (`check_ids` of its inputs)."""
    array = ids_array(name, value)
    if array.dtype.kind not in "biuf":  # text, or another kind no framework holds as ids
        check_ids(name, array.shape, dtype_name(array), False, max_len=2**62)
    return array


def check_learning_rate(lr) -> float:
    """The learning rate a step is about to take, as a Python float: a number (a 0-d tensor or
    variable too: anything with ``__float__``, not a bool), finite and >= 0. Else ``TypeError`` /
    ``ValueError`` naming ``optimizer``, before anything is computed or changed. A negative rate
    climbs the loss; NaN or inf makes every weight NaN in one update; neither framework refuses
    them when a step runs (torch's optimizers only when made, and a param group's ``lr`` can be
    changed after; Keras never)."""
    if isinstance(lr, bool) or isinstance(lr, str) or not hasattr(lr, "__float__"):
        raise TypeError(f"optimizer: expected a learning rate that is a number, got {shown(lr)} "
                        f"({type(lr).__name__})")
    value = float(lr)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"optimizer: expected a learning rate that is finite and >= 0, got {value!r}")
    return value
