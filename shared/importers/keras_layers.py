"""Keras layers as they appear in a weights file, mapped into a `SourceImport` plan. NumPy only.

Shared by the TensorFlow-tutorial and KerasHub importers: both build their attention on
``keras.layers.MultiHeadAttention`` and their feed-forward networks and norms on ``Dense`` and
``LayerNormalization``; only the group paths around them differ.
"""
from __future__ import annotations

import re

import numpy as np

from ..weights import PROJECTIONS
from .common import SourceImport


def list_name(base: str, index: int) -> str:
    """The group name Keras gives the ``index``-th layer of class ``base`` in a list:
    ``base``, ``base_1``, ``base_2``, ..."""
    return base if index == 0 else f"{base}_{index}"


def list_indices(keys, parent: str, base: str) -> list[int]:
    """The indices of ``parent/base[_N]/...`` groups present among ``keys``, sorted."""
    pattern = re.compile(rf"^{re.escape(parent)}{re.escape(base)}(?:_(\d+))?/")
    return sorted({int(m.group(1) or 0) for k in keys if (m := pattern.match(k))})


def dense(imp: SourceImport, src: str, dst: str, n_in: int, n_out: int) -> None:
    """``Dense``: ``vars/0`` the kernel ``(in, out)`` (the canonical layout), ``vars/1`` the bias."""
    imp.expect(f"{src}/vars/0", (n_in, n_out), (f"{dst}.kernel", np.asarray))
    imp.expect(f"{src}/vars/1", (n_out,), (f"{dst}.bias", np.asarray))


def layer_norm(imp: SourceImport, src: str, dst: str, d: int) -> None:
    """``LayerNormalization``: ``vars/0`` gamma, ``vars/1`` beta."""
    imp.expect(f"{src}/vars/0", (d,), (f"{dst}.gamma", np.asarray))
    imp.expect(f"{src}/vars/1", (d,), (f"{dst}.beta", np.asarray))


def multi_head_attention(imp: SourceImport, src: str, dst: str, d: int, heads: int, key_dim: int) -> None:
    """``MultiHeadAttention``: ``{query,key,value}_dense`` kernels ``(d, heads, key_dim)`` and biases
    ``(heads, key_dim)``, ``output_dense`` kernel ``(heads, key_dim, d)`` and bias ``(d,)``.

    Flattening ``(heads, key_dim)`` row-major puts head ``h`` in columns ``h*key_dim ..``, the
    canonical head layout (reshape ``(B, L, H*d_k) -> (B, L, H, d_k)``); Keras scales the query by
    ``1/sqrt(key_dim)`` before the dot product, the canonical model the scores: the same function.
    The value width must equal ``key_dim`` (the canonical heads have one width)."""
    width = heads * key_dim
    for p in PROJECTIONS[:3]:
        imp.expect(f"{src}/{p}_dense/vars/0", (d, heads, key_dim),
                   (f"{dst}.{p}.kernel", lambda a: a.reshape(a.shape[0], width)))
        imp.expect(f"{src}/{p}_dense/vars/1", (heads, key_dim),
                   (f"{dst}.{p}.bias", lambda a: a.reshape(width)))
    imp.expect(f"{src}/output_dense/vars/0", (heads, key_dim, d),
               (f"{dst}.output.kernel", lambda a: a.reshape(width, a.shape[-1])))
    imp.expect(f"{src}/output_dense/vars/1", (d,), (f"{dst}.output.bias", np.asarray))


def attention_sizes(imp: SourceImport, query_kernel: str) -> tuple[int | None, int | None]:
    """``(heads, key_dim)`` read off a query kernel ``(d, heads, key_dim)``; the head count is in
    the shape, so unlike a PyTorch state dict it needs no flag."""
    value = imp.sd.get(query_kernel)
    if isinstance(value, np.ndarray) and value.ndim == 3:
        return int(value.shape[1]), int(value.shape[2])
    imp.problem(f"cannot infer the head count: {query_kernel} expected a MultiHeadAttention kernel "
                f"(d_model, heads, key_dim), got {'nothing' if value is None else np.shape(value)}")
    return None, None
