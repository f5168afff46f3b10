"""Mixed precision in Keras: the ``mixed_bfloat16`` / ``mixed_float16`` dtype policy (float32
variables, half-precision compute) on the layers whose products torch's autocast runs in half
precision; mirrored by `torch_impl.precision` (``torch.autocast``).

    set_precision(model, "bfloat16")   # before the first (traced) call that should use it
    logits = model(src, tgt)           # bfloat16 logits; the loss casts them to float32
    greedy_decode(model, src, 32)      # bfloat16 products, float32 search

The rule is `shared.precision`'s. The policy goes on every ``keras.layers.Dense`` (the four
attention projections, the feed-forward network) and on the generator: each casts its input and
reads its variables in the half dtype. The attention products follow torch's SDPA kernels: scores
in float32 from the half query and key (half products are exact in float32), softmax in float32,
weights cast to the half dtype for the product with the values (`tf_impl.attention._scores`).
Everything else keeps the model's float32 policy: embeddings, the positional encoding, layer norm,
the residual stream (a sublayer's half output is cast to float32 before the residual add, the
promotion torch makes) and the loss.

Decoding's cached step reads its kernels and biases cast once per decode
(`Transformer._step_weights`), casts its float32 activation rows to them (`tf_impl.cache.dense`,
as autocast does), keeps its key/value cache in the half dtype, and its logits are cast to float32
for the search. One rounding differs from torch's (docs/design.md, "Mixed precision"): a half
product's bias is added after the product is rounded, where torch adds it before its one rounding.

A ``tf.function`` keeps the precision it was traced with. tf_impl's own (the compiled decoding
loops, the training step) are made again when it changes (`tf_impl.model._structure`); one of
your own around the model is not: set the precision before its first call.
"""
from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from shared.precision import check_precision, compute_dtype_name, quantized_message

from .model import check_model
from .weights_io import quantized_projections


def set_precision(model: keras.Model, precision: str) -> str:
    """Make ``model`` compute in ``precision`` ("float32", "bfloat16" or "float16"; "fp32", "bf16",
    "fp16" accepted): its forward pass, training and decoding; returns the previous one.
    The variables are untouched (float32)."""
    check_model(model)
    name = check_precision(precision, model.config.dtype)
    quantized = quantized_projections(model)
    if quantized:
        raise ValueError(quantized_message(quantized))
    previous = getattr(model, "precision", "float32")
    model._compute_in(name)
    return previous


def compute_dtype(model: keras.Model) -> tf.DType:
    """The dtype of ``model``'s matrix products: its precision's half dtype, else the model's."""
    check_model(model)  # public: named, where an AttributeError named its config
    return tf.as_dtype(compute_dtype_name(getattr(model, "precision", "float32"), model.config.dtype))


def autocast(model: keras.Model):
    """As torch_impl's: the context a forward pass or a decoding step runs in. The policies set by
    `set_precision` do the work in Keras, so this is nothing."""
    return contextlib.nullcontext()
