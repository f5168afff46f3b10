"""The position-wise feed-forward network: linear, activation, dropout, linear (docs/design.md,
conventions 8 and 15; the activation is ``config.activation``: relu, exact gelu, or swish)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cache import dense


def _relu(x: torch.Tensor) -> torch.Tensor:
    # In place: saves a (B, L, d_ff) allocation per call; safe under autograd, as the Linear does
    # not keep its output for its backward and relu_ keeps its own result.
    return F.relu(x, inplace=True)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="none")  # exact (erf), as the reference


# Named functions, not lambdas: a module holding a lambda cannot be pickled (torch.save(model)).
ACTIVATIONS = {
    "relu": _relu,
    "gelu": _gelu,
    "swish": F.silu,  # x * sigmoid(x)
}


class FeedForward(nn.Module):
    """``outer(dropout(activation(inner(x))))``.

    Args:
        d_model: input and output width; d_ff: inner width; dropout: probability inside (train only).
        activation: a key of `ACTIVATIONS` (``config.activation``).

    Shape:
        ``(B, L, d_model)`` -> ``(B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu", *,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"FeedForward: activation expected one of {tuple(ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.activation = ACTIVATIONS[activation]
        self.inner = nn.Linear(d_model, d_ff, dtype=dtype)
        self.outer = nn.Linear(d_ff, d_model, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.dropout(self.activation(self.inner(x))))  # (B, L, d_ff) inside

    def step_kernels(self) -> tuple[torch.Tensor, ...]:
        """``(inner kernel (d, d_ff), bias, outer kernel (d_ff, d), bias)``, `(in, out)` copies
        detached from autograd (`torch_impl.cache.StepWeights`)."""
        return (self.inner.weight.t().contiguous().detach(), self.inner.bias.detach(),
                self.outer.weight.t().contiguous().detach(), self.outer.bias.detach())

    def step(self, x: torch.Tensor, inner: tuple | None, outer: tuple | None) -> torch.Tensor:
        """`forward` in inference, as a decoding step (and decoding's encoder pass) runs it, with the
        kernels of `step_kernels`: no dropout, no module calls. Same shapes, same values to rounding.
        With the kernels None (a model not as built: `torch_impl.cache._as_built`), `forward`."""
        if inner is None:
            return self(x)
        if self.activation is _relu:  # the rectifier inside the product's kernel (`dense`)
            return dense(dense(x, *inner, relu=True), *outer)
        return dense(self.activation(dense(x, *inner)), *outer)
