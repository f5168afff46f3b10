"""Mixed precision in PyTorch: ``torch.autocast`` with bfloat16 around the model's forward pass;
mirrored by `tf_impl.precision` (the Keras ``mixed_bfloat16`` policy).

    set_precision(model, "bfloat16")   # forward passes (and so training) now autocast
    logits = model(src, tgt)           # bfloat16 logits; the loss casts them to float32

Which operations run in bfloat16 is autocast's CPU list: ``linear`` / ``matmul`` (the four
attention projections, the feed-forward network, the generator) and
``scaled_dot_product_attention``; embeddings, the positional encoding, the residual stream
(float32 + bfloat16 promotes to float32), layer norm and the loss stay float32. The explicit
attention path (traces) computes its scores in float32 from the bfloat16 query and key, as SDPA's
CPU kernel does (`torch_impl.attention`). Decoding (`greedy_decode`, `beam_search`) does not go
through ``forward`` and computes in float32.
"""
from __future__ import annotations

import contextlib

import torch

from shared.precision import check_precision


def set_precision(model: torch.nn.Module, precision: str) -> str:
    """Make ``model``'s forward pass compute in ``precision`` ("float32" or "bfloat16"; "fp32" /
    "bf16" accepted); returns the previous one. The weights are untouched (float32)."""
    name = check_precision(precision, model.config.dtype)
    previous = getattr(model, "precision", "float32")
    model.precision = name
    return previous


def autocast(model: torch.nn.Module):
    """The context a forward pass of ``model`` runs in: ``torch.autocast`` with bfloat16 on the
    model's device when its precision is bfloat16, else nothing."""
    if getattr(model, "precision", "float32") != "bfloat16":
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16)
