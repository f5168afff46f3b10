"""Canonical weights <-> Keras variables: one explicit table, used by import and export.

Canonical dense kernels are ``(in, out)`` (``y = x @ kernel + bias``), which is also the layout of
``keras.layers.Dense.kernel``: nothing is transposed here (torch_impl transposes at its boundary).
Embedding tables are ``(vocab, d_model)``, learned position tables ``(max_len, d_model)``. Tied
weights appear once, under the canonical name of the owner (``src_embed.embeddings`` when
embeddings are shared; no ``generator.kernel`` when tied).

``model`` is a `tf_impl.Transformer`; it is annotated by its framework base class because model.py
calls this module (weights_io sits below the model, and the import graph has no cycles).
"""
from __future__ import annotations

from typing import Mapping

import keras
import numpy as np

from shared.config import TransformerConfig
from shared.messages import type_shown
from shared.weights import PROJECTIONS, WeightsError, changed_layer, check_weights, weight_schema


Table = dict[str, keras.Variable]  # canonical name -> variable


class _Tree:
    """What the table is built for, and the layers found changed after building on the way."""

    def __init__(self, values_only: bool):
        self.values_only, self.problems, self.quantized = values_only, [], []


def check_model_like(model) -> None:
    """``model`` is a built model whose weights this module can name: a ``keras.Model`` holding a
    `TransformerConfig` (a `tf_impl.Transformer`), named by type otherwise before anything reads
    it (else ``'NoneType' object has no attribute 'config'``). `tf_impl.model.check_model` is the
    strict check of the decoders and training, in the same words; it sits above this module."""
    if not isinstance(model, keras.Model) or not isinstance(getattr(model, "config", None), TransformerConfig):
        raise TypeError(f"model: expected a tf_impl.Transformer, got {type_shown(model)}")


def _dense(table: Table, prefix: str, dense: keras.layers.Layer, tree: _Tree) -> None:
    got = _changed(dense, tree.values_only)
    if got:
        tree.problems.append(changed_layer(prefix, got, tree.values_only))
        if getattr(dense, "quantization_mode", None) is not None:  # Model.quantize's
            tree.quantized.append(prefix)
        return
    table[f"{prefix}.kernel"] = dense.kernel  # (in, out) here and in the canonical schema
    table[f"{prefix}.bias"] = dense.bias


def _changed(dense: keras.layers.Layer, values_only: bool) -> str | None:
    """What a projection changed after building is now (`shared.weights.changed_layer`'s
    ``got``), or None where the table may hold its kernel: a ``Dense`` not quantized (whose
    ``kernel`` would be its int8 or int4 values), with LoRA only where values alone are read
    (its ``kernel`` is then the base plus the adapter, a tensor rather than the variable)."""
    if not isinstance(dense, keras.layers.Dense):
        return f"a {type(dense).__module__}.{type(dense).__qualname__}"
    if dense.quantization_mode is not None:
        return f"a Dense quantized to {dense.quantization_mode}"
    if not values_only and dense.lora_enabled:
        return f"a Dense with LoRA enabled (rank {dense.lora_rank})"
    return None


def _norm(table: Table, prefix: str, norm) -> None:
    table[f"{prefix}.gamma"] = norm.gamma
    table[f"{prefix}.beta"] = norm.beta


def _attention(table: Table, prefix: str, attn, tree: _Tree) -> None:
    for p in PROJECTIONS:
        _dense(table, f"{prefix}.{p}", getattr(attn, p), tree)


def _ffn(table: Table, prefix: str, ffn, tree: _Tree) -> None:
    _dense(table, f"{prefix}.inner", ffn.inner, tree)
    _dense(table, f"{prefix}.outer", ffn.outer, tree)


def weight_table(model: keras.Model, source: str = "weight_table", values_only: bool = False) -> Table:
    """Every canonical name, in `shared.weights.weight_schema` order, with its variable.

    A projection changed after the model was built (quantized by ``Model.quantize``, LoRA enabled:
    docs/design.md, "Layers changed after building") has no variable the schema can name: one
    `shared.weights.WeightsError` from ``source`` lists every such layer, before anything is read
    or written. ``values_only`` (an export): a Dense with LoRA enabled is read, its ``kernel``
    (the adapter merged in)."""
    check_model_like(model)
    tree = _Tree(values_only)
    table = _walk(model, tree)
    if tree.problems:
        raise WeightsError(source, tree.problems)
    if list(table) != list(weight_schema(model.config)):  # the layer tree and the schema must never drift
        raise AssertionError("tf_impl.weights_io: variable table does not match weight_schema")
    return table


def quantized_projections(model: keras.Model) -> list[str]:
    """The canonical prefixes (``encoder.layers.0.self_attn.query``) of the projections quantized
    after building (``Model.quantize``), in schema order."""
    check_model_like(model)
    tree = _Tree(values_only=True)
    _walk(model, tree)
    return tree.quantized


def _walk(model: keras.Model, tree: _Tree) -> Table:
    """`weight_table`'s table, the changed layers found on the way in ``tree``."""
    c = model.config
    table: Table = {"src_embed.embeddings": model.src_embed.embeddings}
    if model.src_embed.positions is not None:  # learned positions (config.positional)
        table["src_embed.positions"] = model.src_embed.positions
    if not c.share_embeddings:
        table["tgt_embed.embeddings"] = model.tgt_embed.embeddings
        if model.tgt_embed.positions is not None:
            table["tgt_embed.positions"] = model.tgt_embed.positions
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
        table["generator.kernel"] = model.generator.kernel
    table["generator.bias"] = model.generator.bias
    return table


def import_weights(model: keras.Model, weights: Mapping[str, np.ndarray],
                   allow_nonfinite: bool = False) -> None:
    """Snapshot, check, assign: every tensor of ``weights`` is read once into an owned copy, the
    copies are checked (one `WeightsError` listing all problems, model untouched), and only the
    checked copies are assigned, so a lazy or memory-mapped source whose second read would fail or
    differ cannot leave a half-loaded model. NaN/Inf are refused unless ``allow_nonfinite`` (to
    inspect a diverged run, say)."""
    check_model_like(model)
    checked = check_weights(model.config, weights, source="import_weights", allow_nonfinite=allow_nonfinite)
    for name, variable in weight_table(model, "import_weights").items():
        variable.assign(checked[name])  # same dtype and shape, checked above: an exact copy


def export_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """Canonical ``{name: ndarray}`` in ``config.dtype``, C-contiguous, owning its memory."""
    check_model_like(model)
    return {name: np.array(variable.numpy(), dtype=model.config.dtype, order="C", copy=True)
            for name, variable in weight_table(model, "export_weights", values_only=True).items()}
