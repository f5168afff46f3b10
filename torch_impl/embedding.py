"""Token embeddings scaled by sqrt(d_model), and the sinusoidal positional encoding from `shared`."""
from __future__ import annotations

import math

import torch
from torch import nn

from shared import TransformerConfig
from shared.positional import positional_encoding


class TokenEmbedding(nn.Module):
    """Ids ``(B, L)`` -> vectors ``(B, L, d_model)``, multiplied by ``sqrt(d_model)`` (the paper's
    scaling, which keeps embeddings on the scale of the positional encoding).

    The table is the ``nn.Embedding`` named ``table``; its weight ``(vocab, d_model)`` is also the
    generator's projection when the output is tied.
    """

    def __init__(self, vocab: int, d_model: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.table = nn.Embedding(vocab, d_model, dtype=dtype)
        self.scale = math.sqrt(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int32, torch.int64):  # embedding lookups take int32/int64 only
            ids = ids.long()
        return self.table(ids) * self.scale  # (B, L, d)


class PositionalEncoding(nn.Module):
    """Adds ``PE[:seq]`` (interleaved sin/cos, docs/design.md, convention 4) and applies dropout.

    The table is computed once in float64 by `shared.positional` and cast to the model dtype; it is
    a non-persistent buffer: it follows ``.to(device)`` but is not a weight and is never saved.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        table = torch.from_numpy(positional_encoding(config.max_len, config.d_model))
        self.register_buffer("table", table.to(getattr(torch, config.dtype)), persistent=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``(B, L, d)`` -> ``(B, L, d)``."""
        return self.dropout(x + self.table[: x.shape[1]])
