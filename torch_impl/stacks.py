"""The encoder and decoder stacks: ``n`` layers and, when the config says so, a final layer norm."""
from __future__ import annotations

import torch
from torch import nn

from shared import TransformerConfig

from .layers import DecoderLayer, EncoderLayer, Trace, record
from .norm import LayerNorm


def _final_norm(config: TransformerConfig) -> LayerNorm | None:
    if not config.final_norm:
        return None
    return LayerNorm(config.d_model, config.norm_style, config.norm_eps, getattr(torch, config.dtype))


class Encoder(nn.Module):
    """``layers`` (a ModuleList of `EncoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, S, d)`` (embedded source), mask bool (True = may attend) broadcastable to
    ``(B, H, S, S)`` -> memory ``(B, S, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.final_norm = _final_norm(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, trace, f"encoder.layers.{i}")
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "encoder.final_norm", x)
        return x


class Decoder(nn.Module):
    """``layers`` (a ModuleList of `DecoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, T, d)`` (embedded target), memory ``(B, S, d)``, src_mask broadcastable to
    ``(B, H, T, S)``, tgt_mask to ``(B, H, T, T)`` (bool, True = may attend) -> ``(B, T, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.final_norm = _final_norm(config)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask, trace, f"decoder.layers.{i}")
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "decoder.final_norm", x)
        return x
