"""Mixed precision, the framework-free half: its names and the one check, for both backends.

``"float32"`` computes in the model's dtype. ``"bfloat16"`` is mixed precision: weights, the loss
and Adam stay float32; the matrix products (the dense projections, the attention products, the
generator) take bfloat16 operands. Both backends follow one rule of which operations run in
bfloat16 (docs/design.md, "Mixed precision"): torch through ``torch.autocast``, TensorFlow through
the Keras ``mixed_bfloat16`` policy on the same layers.
"""
from __future__ import annotations

PRECISIONS = ("float32", "bfloat16")
ALIASES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}


def check_precision(precision: str, dtype: str) -> str:
    """The canonical name of ``precision`` (``fp32``/``bf16`` accepted); bfloat16 needs a float32
    model (its float32 weights are the master copy; a float64 model has no bfloat16 mode)."""
    if precision not in ALIASES:
        raise ValueError(f"precision: expected one of {sorted(ALIASES)}, got {precision!r}")
    name = ALIASES[precision]
    if name == "bfloat16" and dtype != "float32":
        raise ValueError(f"precision: bfloat16 mixed precision needs a float32 model, got dtype={dtype}")
    return name
