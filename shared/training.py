"""Checks of the training step's inputs shared by both backends' ``train_step`` and ``gradients``
(NumPy only), so that a bad batch fails with the same type and text in torch_impl and tf_impl
(docs/design.md: the checks are written once, in shared/). The loss's own checks are in
`shared.loss`; a batch's ids are read by `shared.checks.batch_ids`.
"""
from __future__ import annotations

import math

from .messages import shown


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
