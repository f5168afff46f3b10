"""Token embeddings (scaled by sqrt(d_model) unless the config says not), their learned position
tables when ``config.positional == "learned"``, and the positional encoding that adds either table."""
from __future__ import annotations

import math

import torch
from torch import nn

from shared import TransformerConfig
from shared.positional import positional_table


class TokenEmbedding(nn.Module):
    """Ids ``(B, L)`` -> vectors ``(B, L, d_model)``, multiplied by ``sqrt(d_model)`` when ``scale``
    (the paper's scaling, which keeps embeddings on the scale of the positional encoding; keras-hub
    models do not scale).

    The table is the ``nn.Embedding`` named ``table``; its weight ``(vocab, d_model)`` is also the
    generator's projection when the output is tied. With ``max_len`` (learned positions) the
    parameter ``positions`` ``(max_len, d_model)`` is this side's position table (canonical
    ``{src,tgt}_embed.positions``), added by `PositionalEncoding`; otherwise ``positions`` is None.
    """

    def __init__(self, vocab: int, d_model: int, scale: bool = True, max_len: int | None = None, *,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.table = nn.Embedding(vocab, d_model, dtype=dtype)
        self.scale = math.sqrt(d_model) if scale else None
        self.positions = (nn.Parameter(torch.zeros(max_len, d_model, dtype=dtype))
                          if max_len is not None else None)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int32, torch.int64):  # embedding lookups take int32/int64 only
            ids = ids.long()
        vectors = self.table(ids)  # (B, L, d)
        return vectors * self.scale if self.scale is not None else vectors


class PositionalEncoding(nn.Module):
    """Adds a positional table's rows ``[:seq]`` and applies dropout.

    The fixed table (``config.positional == "sinusoidal"``; layout, timescale and offset from the
    config, docs/design.md, conventions 4 and 15) is computed once in float64 by `shared.positional`
    and cast to the model dtype; it is a non-persistent buffer: it follows ``.to(device)`` but is
    not a weight and is never saved. With learned positions ``table`` is None and the caller passes
    the embedding's ``positions``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        table = None
        if config.positional == "sinusoidal":
            table = torch.from_numpy(positional_table(config)).to(getattr(torch, config.dtype))
        self.register_buffer("table", table, persistent=False)
        self.dropout = nn.Dropout(config.dropout)

    def select(self, positions: torch.Tensor | None) -> torch.Tensor:
        """The table to add: ``positions`` (a learned ``(max_len, d)`` table) or the fixed one."""
        return self.table if positions is None else positions

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x ``(B, L, d)`` -> ``(B, L, d)``; ``positions``: see `select`."""
        return self.dropout(x + self.select(positions)[: x.shape[1]])
