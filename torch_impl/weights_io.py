"""Canonical weights <-> torch parameters: one explicit table, used by import and export.

Canonical dense kernels are ``(in, out)`` (``y = x @ kernel + bias``); ``nn.Linear.weight`` is
``(out, in)``, so those, and only those, are transposed here, at the boundary. Embedding tables are
``(vocab, d_model)`` in both, learned position tables ``(max_len, d_model)``. Tied weights appear
once, under the canonical name of the owner.

``model`` is a `torch_impl.Transformer`; it is annotated by its framework base class because
model.py calls this module (weights_io sits below the model, and the import graph has no cycles).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from shared.config import TransformerConfig
from shared.messages import type_shown
from shared.weights import PROJECTIONS, WeightsError, changed_layer, check_weights, weight_schema

from .cache import _PLAIN_TENSORS


Table = dict[str, tuple[nn.Parameter, bool]]  # canonical name -> (parameter, transposed?)


class _Tree:
    """What the table is built for, and the layers found changed after building on the way."""

    def __init__(self, values_only: bool):
        self.values_only, self.problems, self.quantized = values_only, [], []


def check_model_like(model) -> None:
    """``model`` is a built model whose weights this module can name: an ``nn.Module`` holding a
    `TransformerConfig` (a `torch_impl.Transformer`, or ``torch.compile``'s wrapper, which hands
    its attributes through), named by type otherwise before anything reads it (else
    ``'NoneType' object has no attribute 'config'``). `torch_impl.model.check_model` is the strict
    check of the decoders and training, in the same words; it sits above this module."""
    if not isinstance(model, nn.Module) or not isinstance(getattr(model, "config", None), TransformerConfig):
        raise TypeError(f"model: expected a torch_impl.Transformer, got {type_shown(model)}")


def _linear(table: Table, prefix: str, linear: nn.Module, tree: _Tree, bias: bool = True) -> None:
    got = _changed(linear, tree.values_only)
    if got:
        tree.problems.append(changed_layer(prefix, got, tree.values_only))
        if _is_quantized(linear):
            tree.quantized.append(prefix)
        return
    table[f"{prefix}.kernel"] = (linear.weight, True)  # (out, in) here, (in, out) canonical
    if bias:
        table[f"{prefix}.bias"] = (linear.bias, False)


def _is_quantized(module) -> bool:
    """Whether ``module`` is one of ``torch.ao.quantization.quantize_dynamic``'s modules."""
    return type(module).__module__.startswith("torch.ao.nn.quantized")


def _changed(linear: nn.Module, values_only: bool) -> str | None:
    """What a projection changed after building is now (`shared.weights.changed_layer`'s
    ``got``), or None where the table may hold its weight: an ``nn.Linear`` (a subclass too)
    with plain tensors, parametrized only where values alone are read (its ``weight`` is then the
    computed one: an adapter merged in)."""
    if not isinstance(linear, nn.Linear):
        return f"a {type(linear).__module__}.{type(linear).__qualname__}"  # a LoRA wrapper, a quantized module
    if not values_only and parametrize.is_parametrized(linear):
        return f"a Linear with its {', '.join(linear.parametrizations)} parametrized"
    weight = linear.weight
    if type(weight) not in _PLAIN_TENSORS:
        return f"a Linear whose weight is a {type(weight).__name__}"  # a weight-only quantization
    return None


def _norm(table: Table, prefix: str, norm) -> None:
    table[f"{prefix}.gamma"] = (norm.gamma, False)
    table[f"{prefix}.beta"] = (norm.beta, False)


def _attention(table: Table, prefix: str, attn, tree: _Tree) -> None:
    for p in PROJECTIONS:
        _linear(table, f"{prefix}.{p}", getattr(attn, p), tree)


def _ffn(table: Table, prefix: str, ffn, tree: _Tree) -> None:
    _linear(table, f"{prefix}.inner", ffn.inner, tree)
    _linear(table, f"{prefix}.outer", ffn.outer, tree)


def weight_table(model: nn.Module, source: str = "weight_table", values_only: bool = False) -> Table:
    """Every canonical name, in `shared.weights.weight_schema` order, with its parameter.

    A projection changed after the model was built (a LoRA wrapper, a quantized module, a
    parametrization: docs/design.md, "Layers changed after building") has no parameter the schema
    can name: one `shared.weights.WeightsError` from ``source`` lists every such layer, before
    anything is read or written. ``values_only`` (an export): a parametrized Linear is read, its
    computed weight (an adapter merged in)."""
    check_model_like(model)
    tree = _Tree(values_only)
    table = _walk(model, tree)
    if tree.problems:
        raise WeightsError(source, tree.problems)
    if list(table) != list(weight_schema(model.config)):  # the module tree and the schema must never drift
        raise AssertionError("torch_impl.weights_io: parameter table does not match weight_schema")
    return table


def quantized_projections(model: nn.Module) -> list[str]:
    """The canonical prefixes (``encoder.layers.0.self_attn.query``) of the projections quantized
    after building (``torch.ao.quantization.quantize_dynamic``), in schema order."""
    check_model_like(model)
    tree = _Tree(values_only=True)
    _walk(model, tree)
    return tree.quantized


def _walk(model: nn.Module, tree: _Tree) -> Table:
    """`weight_table`'s table, the changed layers found on the way in ``tree``."""
    c = model.config
    table: Table = {"src_embed.embeddings": (model.src_embed.table.weight, False)}
    if model.src_embed.positions is not None:  # learned positions (config.positional)
        table["src_embed.positions"] = (model.src_embed.positions, False)
    if not c.share_embeddings:
        table["tgt_embed.embeddings"] = (model.tgt_embed.table.weight, False)
        if model.tgt_embed.positions is not None:
            table["tgt_embed.positions"] = (model.tgt_embed.positions, False)
    for i, layer in enumerate(model.encoder.layers):
        p = f"encoder.layers.{i}"
        _attention(table, f"{p}.self_attn", layer.self_attn, tree)
        _norm(table, f"{p}.self_attn_norm", layer.self_attn_norm)
        _ffn(table, f"{p}.ffn", layer.ffn, tree)
        _norm(table, f"{p}.ffn_norm", layer.ffn_norm)
    if model.encoder.final_norm is not None:
        _norm(table, "encoder.final_norm", model.encoder.final_norm)
    for i, layer in enumerate(model.decoder.layers):
        p = f"decoder.layers.{i}"
        _attention(table, f"{p}.self_attn", layer.self_attn, tree)
        _norm(table, f"{p}.self_attn_norm", layer.self_attn_norm)
        _attention(table, f"{p}.cross_attn", layer.cross_attn, tree)
        _norm(table, f"{p}.cross_attn_norm", layer.cross_attn_norm)
        _ffn(table, f"{p}.ffn", layer.ffn, tree)
        _norm(table, f"{p}.ffn_norm", layer.ffn_norm)
    if model.decoder.final_norm is not None:
        _norm(table, "decoder.final_norm", model.decoder.final_norm)
    if model.generator.kernel is not None:  # absent when tied to the embedding table
        _linear(table, "generator", model.generator.kernel, tree, bias=False)  # its own bias, next
    table["generator.bias"] = (model.generator.bias, False)
    return table


def import_weights(model: nn.Module, weights: Mapping[str, np.ndarray],
                   allow_nonfinite: bool = False) -> None:
    """Snapshot, check, assign: every tensor of ``weights`` is read once into an owned copy, the
    copies are checked (one `WeightsError` listing all problems, model untouched), and only the
    checked copies are assigned, so a lazy or memory-mapped source whose second read would fail or
    differ cannot leave a half-loaded model. NaN/Inf are refused unless ``allow_nonfinite`` (to
    inspect a diverged run, say)."""
    check_model_like(model)
    checked = check_weights(model.config, weights, source="import_weights", allow_nonfinite=allow_nonfinite)
    table = weight_table(model, "import_weights")
    _check_holds_config_dtype(model, table)
    with torch.no_grad():
        for name, (param, transposed) in table.items():
            value = torch.from_numpy(checked[name])
            param.copy_(value.T if transposed else value)


def _check_holds_config_dtype(model: nn.Module, table: Table) -> None:
    """The parameters hold every value of ``config.dtype``: a model made ``.half()`` or
    ``.bfloat16()`` (the PyTorch idiom for inference in its parameters' dtype, which this backend
    runs) would round what `import_weights` assigns, without a word (``.double()`` holds float32
    exactly and passes)."""
    want = getattr(torch, model.config.dtype)
    narrower = sorted({str(p.dtype)[6:] for p, _ in table.values()
                       if not p.dtype.is_floating_point or torch.finfo(p.dtype).bits < torch.finfo(want).bits
                       or (torch.finfo(p.dtype).bits == torch.finfo(want).bits and p.dtype != want)})
    if narrower:
        raise TypeError(f"model: expected parameters that hold its config's {model.config.dtype}, got "
                        f"{', '.join(narrower)} (.half(), .bfloat16() or .to()): import_weights would "
                        f"round the weights; import them first and convert after, or convert back "
                        f"(model.to(torch.{model.config.dtype})); torch_impl.set_precision computes in "
                        "a half precision on float32 weights")


def export_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """Canonical ``{name: ndarray}`` in ``config.dtype``, C-contiguous, owning its memory (from
    parameters in another dtype, ``.half()``'s or ``.double()``'s, cast to it: NumPy has no
    bfloat16)."""
    check_model_like(model)
    out: dict[str, np.ndarray] = {}
    dtype = getattr(torch, model.config.dtype)
    for name, (param, transposed) in weight_table(model, "export_weights", values_only=True).items():
        value = param.detach()
        value = (value.T if transposed else value).to(dtype).cpu().numpy()
        out[name] = np.array(value, dtype=model.config.dtype, order="C", copy=True)
    return out


def reset_parameters(model: nn.Module) -> None:
    """The training initialisation of `shared.weights.init_weights` (Xavier-uniform matrices, zero
    biases and offsets, unit gains), drawn by torch's generator rather than NumPy's."""
    check_model_like(model)
    with torch.no_grad():
        for name, (param, _) in weight_table(model).items():
            if param.dim() == 2:
                nn.init.xavier_uniform_(param)  # symmetric in fan_in/fan_out: layout does not matter
            elif name.endswith(".gamma"):
                nn.init.ones_(param)
            else:
                nn.init.zeros_(param)
