"""Layer normalisation in the two styles of docs/design.md, convention 6, with ``eps`` always
explicit."""
from __future__ import annotations

import torch
from torch import nn


class LayerNorm(nn.Module):
    """Normalise the last axis, then scale by ``gamma`` and shift by ``beta``.

    Args:
        d_model: size of the normalised (last) axis.
        style: ``"standard"``: ``(x - mean) / sqrt(var + eps)``, biased variance, as
            ``torch.nn.LayerNorm`` and Keras compute it; ``"annotated"``: ``(x - mean) / (std + eps)``
            with the unbiased std, as the Annotated Transformer's own LayerNorm does.
        eps: the epsilon; never a framework default (torch uses 1e-5, Keras 1e-3).

    Shape:
        ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, style: str, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        if style not in ("standard", "annotated"):
            raise ValueError(f"LayerNorm: style expected 'standard' or 'annotated', got {style!r}")
        self.style, self.eps = style, float(eps)
        self.gamma = nn.Parameter(torch.ones(d_model, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(d_model, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _normalize(x, self.gamma, self.beta, self.style == "standard", self.eps)

    def extra_repr(self) -> str:
        return f"{self.gamma.shape[0]}, style={self.style!r}, eps={self.eps:g}"


def _normalize(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, standard: bool,
               eps: float) -> torch.Tensor:
    """`LayerNorm` of ``x`` with these parameters, in the standard style (``standard``) or the
    annotated one; also what a decoding step calls with the norms its cache keeps
    (`torch_impl.layers.DecoderLayer.step`)."""
    if standard:  # F.layer_norm's operation, called without its Python wrapper (a step calls 18)
        return torch.layer_norm(x, gamma.shape, gamma, beta, eps)
    mean = x.mean(dim=-1, keepdim=True)
    std = x.std(dim=-1, keepdim=True)  # unbiased (divides by d - 1)
    return (x - mean) / (std + eps) * gamma + beta
