"""Mixed precision in PyTorch: ``torch.autocast`` in bfloat16 or float16 around the model's forward
pass and its decoding; mirrored by `tf_impl.precision` (the Keras mixed policies).

    set_precision(model, "bfloat16")   # forward passes, training and decoding now autocast
    logits = model(src, tgt)           # bfloat16 logits; the loss casts them to float32
    greedy_decode(model, src, 32)      # bfloat16 products, float32 search

Which operations run in half precision is `shared.precision`'s rule, which is autocast's list for
this model: ``linear`` / ``addmm`` / ``matmul`` (the four attention projections, the feed-forward
network, the generator) and ``scaled_dot_product_attention``; embeddings, the positional encoding,
the residual stream (float32 + half promotes to float32), layer norm and the loss stay float32.
The explicit attention path (traces) computes its scores in float32 from the half query and key,
as SDPA's CPU kernel does (`torch_impl.attention`).

Decoding, and the forward pass in eval mode without gradients, keep half-precision copies of the
kernels and biases (made once and kept while the parameters are unchanged,
`torch_impl.cache._prepared`), so neither casts a weight at the call, only its activation rows;
a decode's key/value cache is half precision; its logits are cast to float32 for the search
(`shared.precision`). A pass with gradients casts under autocast, as autograd needs.
"""
from __future__ import annotations

import contextlib

import torch

from shared import TransformerConfig
from shared.precision import check_precision, compute_dtype_name, names_shown, quantized_message

from .weights_io import _is_quantized, check_model_like, quantized_projections


def set_precision(model: torch.nn.Module, precision: str) -> str:
    """Make ``model`` compute in ``precision`` ("float32", "bfloat16" or "float16"; "fp32", "bf16",
    "fp16" accepted): its forward pass, training and decoding; returns the previous one.
    The weights are untouched (float32)."""
    check_model_like(model)
    name = check_precision(precision, model.config.dtype)
    quantized = _quantized(model)
    if quantized:
        raise ValueError(quantized_message(quantized))
    if name != "float32":  # on .half() or .double() parameters autocast failed, or computed nothing
        held = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                       if p.dtype != torch.float32})
        if held:
            raise TypeError(f"model: expected float32 parameters for {name} (the master copy a half "
                            f"precision computes from), got {', '.join(held)} (.half(), .bfloat16(), "
                            f".double() or .to()); convert back first (model.float())")
    previous = getattr(model, "precision", "float32")
    model.precision = model.generator.precision = name  # the generator: called on its own too
    return previous


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of ``model``'s matrix products: its precision's half dtype, else the model's."""
    check_model_like(model)  # public: named, where an AttributeError named its config
    return getattr(torch, compute_dtype_name(getattr(model, "precision", "float32"), model.config.dtype))


def _products_dtype(weights: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype an inference pass multiplies in, and so the dtype of the weights kept for it
    (`torch_impl.cache._prepared`): autocast's where autocast is on for ``device`` and the weights
    are float32 (all it casts), whether the model's own (`autocast`, a half precision) or a
    caller's ``torch.autocast`` around the call, as the modules would compute; else ``weights``."""
    if weights == torch.float32 and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return weights


def autocast(model: torch.nn.Module):
    """The context a forward pass or a decoding step of ``model`` runs in: ``torch.autocast`` in
    its half dtype on the model's device when its precision is a half one, else nothing."""
    precision = getattr(model, "precision", "float32")
    if precision == "float32":
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return _half_precision(model, torch.autocast(device_type=device, dtype=getattr(torch, precision)))


@contextlib.contextmanager
def _half_precision(model: torch.nn.Module, cast: torch.autocast):
    """``cast``, which names the cause where ``model``'s projections were quantized after its half
    precision was set (`set_precision` refuses the other order): torch's quantized modules take
    float32 alone, and under autocast failed with "expected scalar type Float but found
    BFloat16". Looked for only once the pass has failed, so a working pass pays nothing.
    (Keras computes int8 kernels in a mixed policy: tf_impl runs such a model.)"""
    try:
        with cast:
            yield
    except RuntimeError as error:
        quantized = _quantized(model)
        if not quantized:
            raise
        raise ValueError(
            f"model: expected precision 'float32' for quantized projections, got {model.precision!r} "
            f"with {names_shown(quantized)} quantized: torch's quantized modules compute in float32 "
            "alone; quantize a float32 model (set_precision(model, 'float32') before "
            "quantize_dynamic)") from error


def _quantized(model: torch.nn.Module) -> list[str]:
    """The canonical prefixes of ``model``'s quantized projections; ``model`` a Transformer or
    its generator called on its own."""
    if isinstance(getattr(model, "config", None), TransformerConfig) and hasattr(model, "src_embed"):
        return quantized_projections(model)
    return ["generator"] if _is_quantized(getattr(model, "kernel", None)) else []
