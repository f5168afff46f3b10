"""Helpers for the torch tests: devices, TF32 off, building a model. The backend-neutral interface
built on it: `parity_tests.backends`.

Import only after ``pytest.importorskip("torch")``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

import torch_impl
from shared import TransformerConfig

# CPU always; CUDA whenever this machine has it (docs/design.md, tests: parametrized by device).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def disable_tf32() -> None:
    """TF32 matmuls keep 10 mantissa bits; float32 parity bounds are measured without it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def build(config: TransformerConfig, weights: Mapping[str, np.ndarray] | None = None,
          device: str = "cpu") -> torch_impl.Transformer:
    """A model in eval mode on ``device``, with ``weights`` imported when given."""
    disable_tf32()
    model = torch_impl.Transformer(config)
    if weights is not None:
        model.import_weights(weights)
    return model.to(device).eval()
