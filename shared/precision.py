"""Mixed precision, the framework-free half: its names, the one check, and the rule, for both
backends.

``"float32"`` computes in the model's dtype. ``"bfloat16"`` and ``"float16"`` are mixed precision
(half precision for short): the weights, the loss and Adam stay float32 (the master copy), the
matrix products take half-precision operands. One rule says which operations run in half
precision, the same for the forward pass, training and decoding, in both backends (torch through
``torch.autocast``, TensorFlow through the Keras ``mixed_bfloat16`` / ``mixed_float16`` policy on
the same layers; docs/design.md, "Mixed precision"):

* **half precision**: the four attention projections, the feed-forward network's two products and
  the generator (their operands cast, their outputs half), the attention product of the weights
  with the values;
* **float32**: token embeddings, the positional encoding, the residual stream (a sublayer's half
  output is promoted to float32 before the residual add), layer norm (its mean and variance would
  lose the small differences they measure), the attention scores and softmax (computed in float32
  from the half query and key: their products are exact in float32, and a softmax's sum over a
  long row needs the wider accumulator), the loss (half logits are cast to float32 first), and
  decoding's search (a step's logits are cast to float32 before the log-softmax: half log-probs
  near -7 are 2**-5 apart in bfloat16, far coarser than the gaps beam search ranks).

Why the residual stream and layer norm stay float32: an activation is the sum of every earlier
sublayer's output, and a half-precision sum drifts by one rounding per layer; the stream costs
nothing to keep wide (it is read once per sublayer, the weights are what a step streams).

float16 has 5 exponent bits (largest finite value 65504): a model whose activations or logits
exceed that overflows to inf in float16 and not in bfloat16. The float32 residual stream keeps
the activations out of it; a product's output can still overflow, which the backends report as
non-finite logits rather than hiding.
"""
from __future__ import annotations

PRECISIONS = ("float32", "bfloat16", "float16")
HALF_PRECISIONS = ("bfloat16", "float16")
ALIASES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16"}


def quantized_message(names: list[str]) -> str:
    """``set_precision``'s refusal of a model with quantized projections (``names``, canonical
    prefixes), the same in both backends: a quantized kernel computes in the dtype it was quantized
    for (torch's quantized modules take float32 alone and failed in autocast; a Keras policy set
    over one dropped the quantization, and its int8 values were read as the weights)."""
    return (f"model: expected no quantized projection, got {names_shown(names)}: a quantized kernel "
            "computes in the dtype it was quantized for, which set_precision cannot change")


def names_shown(names: list[str]) -> str:
    """The first three of ``names``, and how many there are in all where there are more."""
    return ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")


def check_precision(precision: str, dtype: str) -> str:
    """The canonical name of ``precision`` (``fp32``/``bf16``/``fp16`` accepted; not "half", which
    names neither); a half precision needs a float32 model (its float32 weights are the master
    copy; a float64 model has no mixed mode)."""
    if not isinstance(precision, str) or precision not in ALIASES:  # a list is no key (unhashable)
        raise ValueError(f"precision: expected one of {sorted(ALIASES)}, got {precision!r}")
    name = ALIASES[precision]
    if name in HALF_PRECISIONS and dtype != "float32":
        raise ValueError(f"precision: {name} mixed precision needs a float32 model, got dtype={dtype}")
    return name


def compute_dtype_name(precision: str, dtype: str) -> str:
    """The dtype name of the matrix products of a model of ``dtype`` in ``precision`` (a canonical
    name): the half one in a half precision, else the model's."""
    return dtype if precision == "float32" else precision
