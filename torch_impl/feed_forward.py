"""The position-wise feed-forward network: linear, ReLU, dropout, linear (docs/design.md,
convention 8)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """``outer(dropout(relu(inner(x))))``.

    Args:
        d_model: input and output width; d_ff: inner width; dropout: probability inside (train only).

    Shape:
        ``(B, L, d_model)`` -> ``(B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.inner = nn.Linear(d_model, d_ff, dtype=dtype)
        self.outer = nn.Linear(d_ff, d_model, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place: saves a (B, L, d_ff) allocation per call; safe under autograd, as the Linear
        # does not keep its output for its backward and relu_ keeps its own result.
        return self.outer(self.dropout(F.relu(self.inner(x), inplace=True)))  # (B, L, d_ff) inside
