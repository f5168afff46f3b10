"""Checks of the training step's inputs shared by both backends' ``train_step`` and ``gradients``
(NumPy only), so that a bad batch fails with the same type and text in torch_impl and tf_impl
(docs/design.md: the checks are written once, in shared/). The loss's own checks are in
`shared.loss`.
"""
from __future__ import annotations

import numpy as np

from .checks import check_ids
from .loss import dtype_name, ids_array


def batch_ids(name: str, value) -> np.ndarray:
    """A batch's ids (``src``, ``tgt`` or ``tgt_out``) that are not a framework's tensor, as a
    NumPy array of numbers (`shared.loss.ids_array`: ragged rows, None and objects refused), text
    refused here (shape first, then dtype, as `shared.checks.check_ids` orders them) because torch
    cannot hold it and TensorFlow would hold it until a later check. The backend converts the
    array and checks its values (`check_ids` of its inputs)."""
    array = ids_array(name, value)
    if array.dtype.kind not in "biuf":  # text, or another kind no framework holds as ids
        check_ids(name, array.shape, dtype_name(array), False, max_len=2**62)
    return array
