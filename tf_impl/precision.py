"""Mixed precision in Keras: the ``mixed_bfloat16`` dtype policy (float32 variables, bfloat16
compute) on the layers whose products torch's autocast runs in bfloat16; mirrored by
`torch_impl.precision` (``torch.autocast``).

    set_precision(model, "bfloat16")   # before the first (traced) call that should use it
    logits = model(src, tgt)           # bfloat16 logits; the loss casts them to float32

The policy goes on every ``keras.layers.Dense`` (the four attention projections, the feed-forward
network) and on the generator: each casts its input and reads its variables as bfloat16. The
attention products follow torch's SDPA CPU kernel: scores in float32 from the bfloat16 query and key
(bfloat16 products are exact in float32), softmax in float32, weights cast to bfloat16 for the
product with the values (`tf_impl.attention`). Everything else keeps the model's float32 policy:
embeddings, the positional encoding, layer norm, the residual stream (a sublayer's bfloat16 output
is cast to float32 before the residual add, the promotion torch makes) and the loss.

A ``tf.function`` keeps the precision it was traced with: set it before the first call.
"""
from __future__ import annotations

import contextlib

import keras

from shared.precision import check_precision

from .model import Generator


def set_precision(model: keras.Model, precision: str) -> str:
    """Make ``model`` compute in ``precision`` ("float32" or "bfloat16"; "fp32" / "bf16" accepted);
    returns the previous one. The variables are untouched (float32)."""
    name = check_precision(precision, model.config.dtype)
    previous = getattr(model, "precision", "float32")
    policy = "mixed_bfloat16" if name == "bfloat16" else model.config.dtype
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (keras.layers.Dense, Generator)):
            layer.dtype_policy = policy
    object.__setattr__(model, "precision", name)  # a plain value, past Keras' attribute tracking
    return previous


def autocast(model: keras.Model):
    """As torch_impl's: the context a forward pass runs in. The policies set by `set_precision` do
    the work in Keras, so this is nothing."""
    return contextlib.nullcontext()
