"""Export to ONNX: an encoder and a cached decoder that ONNX Runtime serves, in the three-file layout
Hugging Face Optimum uses for seq2seq models (``ORTModelForSeq2SeqLM``), built from the canonical
weights (`shared.weights`), so a model trained in either backend or imported from any source exports
alike. NumPy at import; ``onnx`` only inside `to_onnx` / `build_models` (``import shared`` never
loads it). The layout, inputs, outputs and refusals are in docs/formats/onnx.md.

=============================  ==================================================================
file                           graph (B batch, S source length, T target length, P past length)
=============================  ==================================================================
``encoder_model.onnx``         ``input_ids`` int64 (B, S), ``attention_mask`` int64 (B, S), nonzero
                               = a real token -> ``last_hidden_state`` (B, S, d_model)
``decoder_model.onnx``         ``input_ids`` int64 (B, T), ``encoder_hidden_states`` (B, S, d_model),
                               ``encoder_attention_mask`` int64 (B, S) -> ``logits`` (B, T, V) and,
                               per layer i, ``present.{i}.decoder.key`` / ``.value`` (B, H, T, d_k)
                               and ``present.{i}.encoder.key`` / ``.value`` (B, H, S, d_k)
``decoder_with_past_model``    ``input_ids`` int64 (B, 1), ``encoder_attention_mask``,
``.onnx``                      ``past_key_values.{i}.decoder.key`` / ``.value`` (B, H, P, d_k),
                               ``past_key_values.{i}.encoder.key`` / ``.value`` (B, H, S, d_k) ->
                               ``logits`` (B, 1, V), ``present.{i}.decoder.key`` / ``.value``
                               (B, H, P + 1, d_k); the new token is at position P
``config.json``                the project's config (``format_version`` + ``config``, as a neutral
                               checkpoint's), so `read_onnx` rebuilds the model's description;
                               for a model transformers' Marian describes, Marian's keys beside
                               them (Optimum's ``ORTModelForSeq2SeqLM`` loads the directory)
``generation_config.json``     start, BOS, EOS and pad ids and the longest decode, Hugging Face's keys
=============================  ==================================================================

**Every variant is computed exactly** (docs/design.md, convention 15): both norm placements and
styles (``standard`` is ONNX's ``LayerNormalization``; ``annotated``, the unbiased std with eps
added to it, is written out), the final norms, gelu (exact: ``Erf``) and swish (``x *
Sigmoid(x)``), learned positions (the weights) or the fixed table of `shared.positional` (layout,
timescale and ``pe_offset`` included, stored as a constant in the model's dtype), ``embed_scale``,
``head_dim``, shared and tied tables (the tied generator is ``Transpose`` of the stored table, not
a second copy), ``float32`` and ``float64``, and float16 mixed precision (below). `refusals` names
what is refused: gelu in float64 (ONNX Runtime has no float64 ``Erf``), bfloat16. A graph over
protobuf's 2 GiB keeps its weights in an external data file beside it (``GRAPH.onnx.data``).

**float16** (``precision="float16"`` / ``"fp16"``, a float32 model): `shared.precision`'s rule as
torch_impl's ``set_precision(model, "float16")`` computes it. The products' kernels and biases are
float16 initializers (`product_weights`); the products, the attention weights' product with the
values, the key/value cache and ``logits`` are float16; embeddings, positions, the residual stream,
layer norms, scores and softmax, gelu/swish (rounded once, as torch's half kernels) and
``last_hidden_state`` float32, with ``Cast`` nodes at the boundaries (`_Builder.to_compute`,
`_Builder.to_stream`). The search widens the logits (`twins.onnx_runtime`). A kernel float16
cannot hold is refused (`half_range_problems`); ``config.json`` records the precision
(`export_precision`). docs/formats/onnx.md, "float16", says why each choice and what ONNX Runtime's
CPU does with such a graph (its products in float32: not faster there).

**Masks** (conventions 2 and 3). ``attention_mask`` / ``encoder_attention_mask`` mark the keys that
may be attended (nonzero = real), as the project's source mask ``src != pad_id`` does; the caller
derives them (with ``mask_padding=False`` the project's rule is all ones: `source_mask`). A masked
key gets an additive ``-inf`` and so a weight of exactly 0; a query row with no key at all attends
everything and its context is multiplied by 0, so its attention output is the output projection's
bias alone, as in the oracle (never NaN, never a uniform row). ``decoder_model`` masks the target
as the full pass does: causal AND ``input_ids != pad_id`` (column 0 always real when decoding starts
from pad; no padding mask with ``mask_padding=False``), so its logits are the oracle's on any
target; ``decoder_with_past`` attends every cached position, as the backends' cached steps do (a
decode never feeds pad before the row has finished, and a finished row's logits are not read).

**Ids**: a negative id or one past the vocabulary makes the run fail in ONNX Runtime (``Gather``
is sent an index past the table) rather than wrap around as ONNX's ``Gather`` would for a negative
one; `twins.onnx_runtime` checks ids before a run and names the argument.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ..checks import check_config
from ..config import TransformerConfig
from ..masks import padding_id, start_is_pad
from ..positional import positional_table
from ..precision import check_precision
from ..paths import check_path, read_json
from ..saving import recover, replace_directory
from ..weights import (FORMAT_VERSION, check_weights, read_config_file, tgt_embedding_name, tgt_positions_name,
                       weight_schema)
from . import marian
from .common import ExportError, check_replaceable

OPSET = 17  # LayerNormalization is an operator from opset 17 on
ENCODER, DECODER, DECODER_WITH_PAST = "encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"
GRAPHS = (ENCODER, DECODER, DECODER_WITH_PAST)
CONFIG_FILE, GENERATION_FILE = "config.json", "generation_config.json"
EXTERNAL_SUFFIX = ".data"  # a graph over protobuf's limit keeps its weights in GRAPH + ".data"
MODEL_FILES = frozenset({*GRAPHS, CONFIG_FILE, GENERATION_FILE, *(g + EXTERNAL_SUFFIX for g in GRAPHS)})
PROTOBUF_LIMIT = 2**31 - 2**24  # bytes of initializers above which a graph goes to external data
_DTYPES = {"float32": np.float32, "float64": np.float64}
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504: a float16 kernel or bias above it is inf


def refusals(config: TransformerConfig, precision: str = "float32") -> list[str]:
    """The settings of ``config`` (in ``precision``, a canonical name of `shared.precision`) the
    export cannot compute exactly, each with the reason; [] if none. Every field of convention 15,
    both dtypes and float16 are expressed (module docstring)."""
    out = []
    if precision == "bfloat16":
        out.append("precision='bfloat16': ONNX Runtime's CPU execution provider has no bfloat16 "
                   "kernel of MatMul, Add or Softmax (onnxruntime 1.32 refuses such a graph: "
                   "NOT_IMPLEMENTED), so nothing here could verify or serve the export; export "
                   "precision='float16' (or float32)")
    if config.dtype not in _DTYPES:  # the config admits no other today; kept explicit for new ones
        out.append(f"dtype={config.dtype!r}: the ONNX export writes float32 or float64 graphs")
    if config.dtype == "float64" and config.activation == "gelu":
        out.append("activation='gelu' with dtype='float64': ONNX Runtime has no float64 kernel of "
                   "Erf (the exact gelu's; it would refuse to load the graph), and erf computed in "
                   "float32 would not be the float64 model; export a float32 copy")
    return out


def half_range_problems(config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> list[str]:
    """The kernels and biases of ``weights`` a float16 export cannot hold: a value beyond float16's
    largest finite one (65504) would be stored as inf (`product_weights` names the tensors; a tied
    generator's table too, which the graph casts to float16 for the product)."""
    out = []
    tied = [tgt_embedding_name(config)] if config.tie_output else []
    for name in product_weights(config) + tied:
        peak = float(np.max(np.abs(weights[name]))) if weights[name].size else 0.0
        if peak > FLOAT16_MAX:
            out.append(f"{name}: values up to {peak:.6g} exceed float16's largest finite value "
                       f"{FLOAT16_MAX:g} (they would be stored as inf); export float32")
    return out


def product_weights(config: TransformerConfig) -> list[str]:
    """The canonical names of the kernels and biases of the matrix products, the weights a float16
    export stores as float16 (`shared.precision`: embeddings, positions and norms stay float32;
    a tied generator's kernel is the float32 table, cast in the graph)."""
    return [name for name in weight_schema(config) if name.endswith((".kernel", ".bias"))]


def past_names(layers: int, prefix: str, parts=("decoder", "encoder")) -> list[str]:
    """``{prefix}.{i}.{part}.{key,value}`` for every layer, in the order the graphs list them
    (``prefix`` ``past_key_values`` for inputs, ``present`` for outputs)."""
    return [f"{prefix}.{i}.{part}.{kv}" for i in range(layers) for part in parts for kv in ("key", "value")]


def source_mask(config: TransformerConfig, src: np.ndarray) -> np.ndarray:
    """The ``attention_mask`` int64 (B, S) of the project's default source mask: ``src != pad_id``,
    or all ones with ``mask_padding=False`` (`shared.masks.padding_id`)."""
    pad = padding_id(config)
    src = np.asarray(src)
    return np.ones(src.shape, np.int64) if pad is None else (src != pad).astype(np.int64)


# -- graph construction ---------------------------------------------------------------------------
class _Graph:
    """Nodes and initializers of one graph, named as they are made (``onnx.helper`` underneath)."""

    def __init__(self, onnx, dtype):
        self.onnx, self.dtype = onnx, np.dtype(dtype)
        self.nodes, self.initializers, self._count, self._consts = [], [], 0, {}

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def weight(self, name: str, array: np.ndarray) -> str:
        """An initializer named ``name`` (the canonical weight name where there is one)."""
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, dtype=None) -> str:
        """A constant initializer (deduplicated by value): scalars in the model dtype by default."""
        array = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(self.name("const"), array)
        return self._consts[key]

    def op(self, op_type: str, *inputs: str, outputs: int | list[str] = 1, **attrs):
        """Append a node; its output name (or names, when ``outputs`` is a count > 1 or a list)."""
        names = outputs if isinstance(outputs, list) else [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), names, **attrs))
        return names if len(names) > 1 else names[0]


class _Builder:
    """The network of docs/design.md on a `_Graph`, each method one formula of the oracle
    (`shared.reference`), masks as the module docstring says. The graph's dtype is the stream's
    (the model's); ``compute`` is the products' (float16 in that precision, else the same), and
    `to_compute` / `to_stream` are the Casts at the boundaries `shared.precision` draws."""

    def __init__(self, onnx, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                 precision: str = "float32"):
        self.c, self.w = config, weights
        self.g = _Graph(onnx, _DTYPES[config.dtype])
        self.half = precision != "float32"
        self.compute = np.dtype(precision) if self.half else self.g.dtype
        self.d_k = config.head_dim if config.head_dim is not None else config.d_model // config.n_heads
        self.table = positional_table(config).astype(self.g.dtype) if config.positional == "sinusoidal" else None
        self._stored: dict[str, str] = {}

    def stored(self, name: str, product: bool = False) -> str:
        """The canonical weight ``name`` as an initializer, added once per graph; a ``product``'s
        kernel or bias in the products' dtype (rounded to nearest, as torch's ``.to(float16)``)."""
        if name not in self._stored:
            array = self.w[name].astype(self.compute) if product else self.w[name]
            self._stored[name] = self.g.weight(name, array)
        return self._stored[name]

    def fused(self, prefixes: list[str], part: str) -> str:
        """Kernels (or biases) of ``prefixes`` concatenated along the output axis, one initializer
        in the products' dtype: one product computes several projections of the same input."""
        name = "+".join(prefixes) + f".{part}"
        if name not in self._stored:
            array = np.concatenate([self.w[f"{p}.{part}"] for p in prefixes], -1).astype(self.compute)
            self._stored[name] = self.g.weight(name, array)
        return self._stored[name]

    def to_compute(self, x: str) -> str:
        """A stream tensor as a product's operand: Cast to float16 in that precision."""
        return self.g.op("Cast", x, to=self._onnx_dtype(self.compute)) if self.half else x

    def to_stream(self, x: str) -> str:
        """A product's output into the float32 stream (exact widening) in a half precision."""
        return self.g.op("Cast", x, to=self._onnx_dtype()) if self.half else x

    # building blocks
    def dense(self, x: str, *prefixes: str) -> str:
        """``x @ kernel + bias``, ``x`` and the result in the products' dtype; several
        ``prefixes`` give their outputs side by side."""
        g = self.g
        if len(prefixes) == 1:
            kernel, bias = self.stored(f"{prefixes[0]}.kernel", True), self.stored(f"{prefixes[0]}.bias", True)
        else:
            kernel, bias = self.fused(list(prefixes), "kernel"), self.fused(list(prefixes), "bias")
        return g.op("Add", g.op("MatMul", x, kernel), bias)

    def norm(self, x: str, prefix: str) -> str:
        g, c = self.g, self.c
        gamma, beta = self.stored(f"{prefix}.gamma"), self.stored(f"{prefix}.beta")
        if c.norm_style == "standard" and g.dtype != np.float64:
            # (x - mean) / sqrt(biased var + eps) * gamma + beta, one operator
            return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=float(c.norm_eps))
        # Written out: the annotated norm, and the standard one in float64, where eps must be a
        # float64 constant: LayerNormalization's epsilon is an attribute, a 32-bit float, and an eps
        # float32 cannot hold (1e-5, 1e-3, 0.1) put the logits up to 1.8e-9 of their scale off the
        # oracle (test_onnx.py, variant norm-eps-0.1).
        centered = g.op("Sub", x, g.op("ReduceMean", x, axes=[-1], keepdims=1))
        squares = g.op("Mul", centered, centered)
        if c.norm_style == "standard":  # the biased variance, eps inside the root
            variance = g.op("ReduceMean", squares, axes=[-1], keepdims=1)
            scale = g.op("Sqrt", g.op("Add", variance, g.const(c.norm_eps)))
        else:  # annotated: the unbiased std, eps added to it
            total = g.op("ReduceSum", squares, g.const([-1], np.int64), keepdims=1)
            scale = g.op("Add", g.op("Sqrt", g.op("Div", total, g.const(c.d_model - 1))), g.const(c.norm_eps))
        return g.op("Add", g.op("Mul", g.op("Div", centered, scale), gamma), beta)

    def activation(self, x: str) -> str:
        """The nonlinearity on the inner product's output (its dtype). In float16, gelu and swish
        are computed in float32 and rounded once, as torch's half kernels do (in float, its
        "opmath"); relu is exact in any dtype."""
        g, kind = self.g, self.c.activation
        if kind == "relu":
            return g.op("Relu", x)
        x = self.to_stream(x)
        if kind == "swish":
            return self.to_compute(g.op("Mul", x, g.op("Sigmoid", x)))
        # exact gelu: 0.5 x (1 + erf(x / sqrt 2))
        erf = g.op("Erf", g.op("Div", x, g.const(math.sqrt(2.0))))
        return self.to_compute(g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", erf, g.const(1.0))))

    def embed(self, ids: str, table: str, positions: str | None, start: str) -> str:
        """(B, L) ids -> (B, L, d): table[ids] (* sqrt(d)) + positions[start : start + L]."""
        g, c = self.g, self.c
        vocab = self.w[table].shape[0]
        valid = g.op("And", g.op("GreaterOrEqual", ids, g.const(0, np.int64)),
                     g.op("Less", ids, g.const(vocab, np.int64)))
        ids = g.op("Where", valid, ids, g.const(vocab, np.int64))  # a bad id: Gather fails, never wraps
        x = g.op("Gather", self.stored(table), ids, axis=0)
        if c.embed_scale:
            x = g.op("Mul", x, g.const(math.sqrt(c.d_model)))
        pe = self.stored(positions) if positions is not None else self._fixed_table()
        length = g.op("Slice", g.op("Shape", ids), g.const([1], np.int64), g.const([2], np.int64))
        rows = g.op("Slice", pe, start, g.op("Add", start, length), g.const([0], np.int64))
        return g.op("Add", x, rows)

    def _fixed_table(self) -> str:
        if "positional_table" not in self._stored:
            self._stored["positional_table"] = self.g.weight("positional_table", self.table)
        return self._stored["positional_table"]

    def heads(self, x: str) -> str:
        """(B, L, H * d_k) -> (B, H, L, d_k)."""
        g = self.g
        split = g.op("Reshape", x, g.const([0, 0, self.c.n_heads, self.d_k], np.int64))
        return g.op("Transpose", split, perm=[0, 2, 1, 3])

    def attend(self, q: str, k: str, v: str, bias: str | None, keep: str | None, prefix: str) -> str:
        """q (B, H, Q, d_k), k and v (B, H, K, d_k) in the products' dtype; ``bias`` additive
        0 / -inf broadcasting to (B, 1, Q, K); ``keep`` (B, 1, Q|1, 1) 1 / 0 zeroes the context of
        rows with no key; -> the output projection of the context (B, Q, d), products' dtype.
        In float16 the scores and softmax are float32 from the half query and key (their
        products are exact in float32), the weights rounded to float16 for the product with the
        values, as torch_impl's attention computes under autocast."""
        g = self.g
        q, k = self.to_stream(q), self.to_stream(k)
        scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                      g.const(math.sqrt(self.d_k)))
        if bias is not None:
            scores = g.op("Add", scores, bias)
        context = g.op("MatMul", self.to_compute(g.op("Softmax", scores, axis=-1)), v)  # (B, H, Q, d_k)
        if keep is not None:
            context = g.op("Mul", context, keep)
        merged = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]),
                      g.const([0, 0, self.c.n_heads * self.d_k], np.int64))
        return self.dense(merged, f"{prefix}.output")

    def mask(self, allowed: str) -> tuple[str, str]:
        """A bool mask broadcasting to (B, 1, Q, K) -> (additive bias in the stream's dtype, keep
        in the products'): a row with no allowed key allows every key (finite softmax) and its
        context is multiplied by ``keep`` = 0."""
        g = self.g
        any_key = g.op("ReduceMax", g.op("Cast", allowed, to=self._onnx_dtype()), axes=[-1], keepdims=1)
        empty = g.op("Equal", any_key, g.const(0.0))
        bias = g.op("Where", g.op("Or", allowed, empty), g.const(0.0), g.const(-np.inf))
        return bias, self.to_compute(any_key)

    def _onnx_dtype(self, dtype=None) -> int:
        """The ONNX type of ``dtype`` (default: the stream's)."""
        return self.g.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(self.g.dtype if dtype is None else dtype))

    def source_bias(self, attention_mask: str) -> tuple[str, str]:
        """``attention_mask`` int64 (B, S) -> bias (B, 1, 1, S), keep (B, 1, 1, 1)."""
        g = self.g
        allowed = g.op("Not", g.op("Equal", attention_mask, g.const(0, np.int64)))
        return self.mask(g.op("Unsqueeze", allowed, g.const([1, 2], np.int64)))

    def target_bias(self, ids: str) -> tuple[str, str]:
        """Target ids (B, T) -> bias (B, 1, T, T), keep (B, 1, T, 1): causal AND not padding
        (column 0 real when decoding starts from pad; no padding with mask_padding=False)."""
        g, c = self.g, self.c
        length = g.op("Squeeze", g.op("Slice", g.op("Shape", ids), g.const([1], np.int64),
                                      g.const([2], np.int64)), g.const([0], np.int64))
        index = g.op("Range", g.const(0, np.int64), length, g.const(1, np.int64))  # (T,)
        causal = g.op("LessOrEqual", g.op("Unsqueeze", index, g.const([0], np.int64)),
                      g.op("Unsqueeze", index, g.const([1], np.int64)))  # (T, T): key <= query
        allowed = causal
        pad = padding_id(c)
        if pad is not None:
            keys = g.op("Not", g.op("Equal", ids, g.const(pad, np.int64)))  # (B, T)
            if start_is_pad(c):
                keys = g.op("Or", keys, g.op("Equal", index, g.const(0, np.int64)))
            allowed = g.op("And", g.op("Unsqueeze", keys, g.const([1, 2], np.int64)), causal)
        else:
            allowed = g.op("Unsqueeze", causal, g.const([0, 1], np.int64))
        return self.mask(allowed)

    def sublayer(self, x: str, name: str, fn) -> str:
        """Pre-norm ``x + fn(norm(x))`` or post-norm ``norm(x + fn(x))``; ``fn`` takes the stream
        and returns the products' dtype, widened before the residual add."""
        g = self.g
        if self.c.norm_first:
            return g.op("Add", x, self.to_stream(fn(self.norm(x, f"{name}_norm"))))
        return self.norm(g.op("Add", x, self.to_stream(fn(x))), f"{name}_norm")

    def ffn(self, x: str, prefix: str) -> str:
        inner = self.dense(self.to_compute(x), f"{prefix}.inner")
        return self.dense(self.activation(inner), f"{prefix}.outer")

    def self_attention(self, x: str, prefix: str, bias, keep, past: tuple[str, str] | None,
                       present: tuple[str, str] | None) -> str:
        """q|k|v from one product; with ``past`` the new key and value are appended to it;
        ``present`` names the full key and value as graph outputs."""
        g = self.g
        qkv = self.dense(self.to_compute(x), *(f"{prefix}.{p}" for p in ("query", "key", "value")))
        q, k, v = g.op("Split", qkv, g.const([self.c.n_heads * self.d_k] * 3, np.int64), axis=-1, outputs=3)
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        if past is not None:
            k = g.op("Concat", past[0], k, axis=2, outputs=[present[0]])
            v = g.op("Concat", past[1], v, axis=2, outputs=[present[1]])
        elif present is not None:
            k = g.op("Identity", k, outputs=[present[0]])
            v = g.op("Identity", v, outputs=[present[1]])
        return self.attend(q, k, v, bias, keep, prefix)

    def memory_kv(self, memory: str, prefix: str, present: tuple[str, str]) -> tuple[str, str]:
        """Cross-attention keys and values of the memory (B, S, d), from one product."""
        g = self.g
        k, v = g.op("Split", self.dense(self.to_compute(memory), f"{prefix}.key", f"{prefix}.value"),
                    g.const([self.c.n_heads * self.d_k] * 2, np.int64), axis=-1, outputs=2)
        return (g.op("Identity", self.heads(k), outputs=[present[0]]),
                g.op("Identity", self.heads(v), outputs=[present[1]]))

    def final(self, x: str, stack: str) -> str:
        return self.norm(x, f"{stack}.final_norm") if self.c.final_norm else x

    def logits(self, x: str) -> str:
        """The generator on the stream ``x``: ``logits`` in the products' dtype (float16 in that
        precision: the search widens them, `twins.onnx_runtime.OnnxStep`)."""
        g, c = self.g, self.c
        if c.tie_output:  # the float32 table, transposed (and cast) once by constant folding
            kernel = self.to_compute(g.op("Transpose", self.stored(tgt_embedding_name(c)), perm=[1, 0]))
        else:
            kernel = self.stored("generator.kernel", True)
        return g.op("Add", g.op("MatMul", self.to_compute(x), kernel), self.stored("generator.bias", True),
                    outputs=["logits"])

    def decoder_layers(self, x: str, self_bias, self_keep, cross_bias, cross_keep, cached: bool,
                       memory: str | None) -> str:
        c = self.c
        for i in range(c.n_decoder_layers):
            p = f"decoder.layers.{i}"
            present = (f"present.{i}.decoder.key", f"present.{i}.decoder.value")
            past = (f"past_key_values.{i}.decoder.key", f"past_key_values.{i}.decoder.value") if cached else None
            x = self.sublayer(x, f"{p}.self_attn",
                              lambda h: self.self_attention(h, f"{p}.self_attn", self_bias, self_keep, past, present))
            if cached:
                k, v = f"past_key_values.{i}.encoder.key", f"past_key_values.{i}.encoder.value"
            else:
                k, v = self.memory_kv(memory, f"{p}.cross_attn", (f"present.{i}.encoder.key",
                                                                  f"present.{i}.encoder.value"))

            def cross(h, p=p, k=k, v=v):
                q = self.heads(self.dense(self.to_compute(h), f"{p}.cross_attn.query"))
                return self.attend(q, k, v, cross_bias, cross_keep, f"{p}.cross_attn")
            x = self.sublayer(x, f"{p}.cross_attn", cross)
            x = self.sublayer(x, f"{p}.ffn", lambda h: self.ffn(h, f"{p}.ffn"))
        return self.logits(self.final(x, "decoder"))

    # the three graphs
    def encoder(self):
        g, c = self.g, self.c
        bias, keep = self.source_bias("attention_mask")
        x = self.embed("input_ids", "src_embed.embeddings",
                       "src_embed.positions" if c.positional == "learned" else None, g.const([0], np.int64))
        for i in range(c.n_encoder_layers):
            p = f"encoder.layers.{i}"
            x = self.sublayer(x, f"{p}.self_attn",
                              lambda h: self.self_attention(h, f"{p}.self_attn", bias, keep, None, None))
            x = self.sublayer(x, f"{p}.ffn", lambda h: self.ffn(h, f"{p}.ffn"))
        g.op("Identity", self.final(x, "encoder"), outputs=["last_hidden_state"])
        inputs = [("input_ids", np.int64, ["batch", "src_len"]), ("attention_mask", np.int64, ["batch", "src_len"])]
        return inputs, [("last_hidden_state", self.g.dtype, ["batch", "src_len", c.d_model])]

    def decoder(self):
        c = self.c
        self_bias, self_keep = self.target_bias("input_ids")
        cross_bias, cross_keep = self.source_bias("encoder_attention_mask")
        x = self.embed("input_ids", tgt_embedding_name(c), tgt_positions_name(c), self.g.const([0], np.int64))
        self.decoder_layers(x, self_bias, self_keep, cross_bias, cross_keep, False, "encoder_hidden_states")
        inputs = [("input_ids", np.int64, ["batch", "tgt_len"]),
                  ("encoder_hidden_states", self.g.dtype, ["batch", "src_len", c.d_model]),
                  ("encoder_attention_mask", np.int64, ["batch", "src_len"])]
        kv = {"decoder": "tgt_len", "encoder": "src_len"}
        outputs = [("logits", self.compute, ["batch", "tgt_len", c.tgt_vocab])] + [
            (n, self.compute, ["batch", c.n_heads, kv[n.split(".")[2]], self.d_k])
            for n in past_names(c.n_decoder_layers, "present")]
        return inputs, outputs

    def decoder_with_past(self):
        g, c = self.g, self.c
        cross_bias, cross_keep = self.source_bias("encoder_attention_mask")
        past = g.op("Slice", g.op("Shape", "past_key_values.0.decoder.key"), g.const([2], np.int64),
                    g.const([3], np.int64))  # (1,): P, the new token's position
        x = self.embed("input_ids", tgt_embedding_name(c), tgt_positions_name(c), past)
        self.decoder_layers(x, None, None, cross_bias, cross_keep, True, None)
        kv = {"decoder": "past_len", "encoder": "src_len"}
        inputs = [("input_ids", np.int64, ["batch", 1]), ("encoder_attention_mask", np.int64, ["batch", "src_len"])] + [
            (n, self.compute, ["batch", c.n_heads, kv[n.split(".")[2]], self.d_k])
            for n in past_names(c.n_decoder_layers, "past_key_values")]
        outputs = [("logits", self.compute, ["batch", 1, c.tgt_vocab])] + [
            (n, self.compute, ["batch", c.n_heads, "past_len + 1", self.d_k])
            for n in past_names(c.n_decoder_layers, "present", ("decoder",))]
        return inputs, outputs


def _model(onnx, config: TransformerConfig, weights, graph: str, precision: str = "float32"):
    builder = _Builder(onnx, config, weights, precision)
    method = {ENCODER: builder.encoder, DECODER: builder.decoder, DECODER_WITH_PAST: builder.decoder_with_past}
    inputs, outputs = method[graph]()
    helper = onnx.helper

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    g = builder.g
    body = helper.make_graph(g.nodes, graph.removesuffix(".onnx"), [info(*i) for i in inputs],
                             [info(*o) for o in outputs], initializer=g.initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="twin-transformer",
                              doc_string=f"{graph} ({precision}): {config.to_json()}")
    model.ir_version = 8  # the IR of opset 17: read by every ONNX Runtime since 1.13
    return model


def build_models(config: TransformerConfig, weights: Mapping[str, np.ndarray], precision: str = "float32") -> dict:
    """``{file name: onnx.ModelProto}`` for the three graphs computing in ``precision`` (float32:
    the model's dtype; "float16" / "fp16": `shared.precision`'s mixed precision, float32 models
    only), each checked by ``onnx.checker``. ``ValueError`` naming ``precision`` for an unknown one
    or a float64 model in float16; `ExportError` naming every setting the export cannot compute
    (`refusals`: bfloat16, gelu in float64) or every kernel float16 cannot hold."""
    check_config(config)  # before its dtype is read (an AttributeError named nothing)
    precision = check_precision(precision, config.dtype)
    problems = refusals(config, precision)
    if problems:
        raise ExportError("to_onnx: config", problems)
    weights = check_weights(config, weights, source="to_onnx: weights")
    if precision == "float16" and (problems := half_range_problems(config, weights)):
        raise ExportError("to_onnx: weights in float16", problems)
    import onnx

    models = {name: _model(onnx, config, weights, name, precision) for name in GRAPHS}
    for model in models.values():
        if model.ByteSize() < PROTOBUF_LIMIT:
            onnx.checker.check_model(model, full_check=True)
    return models


def generation_config(config: TransformerConfig) -> dict:
    """Hugging Face's generation keys for the model: the Marian export's (start token, EOS, pad
    never generated, no EOS forced), and the longest decode (``max_length`` counts the start token,
    so ``config.max_len`` new tokens)."""
    return {**marian.generation_config(config), "max_length": config.max_len + 1}


def config_file(config: TransformerConfig, precision: str = "float32") -> dict:
    """``config.json``: the project's (``format_version``, ``config``: `read_onnx`; ``precision``,
    what the graphs compute in: `export_precision`), and, when
    transformers' Marian describes the model (`shared.exporters.marian.marian_problems` is empty),
    Marian's keys beside them, so that Optimum's ``ORTModelForSeq2SeqLM`` loads the directory as
    it is (it reads ``model_type`` and the sizes and ids; ONNX Runtime computes the graphs)."""
    header = {"format_version": FORMAT_VERSION, "config": config.to_dict(), "precision": precision}
    return {**marian.marian_config(config), **header} if not marian.marian_problems(config) else header


def _write(onnx, models: dict, config: TransformerConfig, precision: str, folder: Path) -> None:
    for name, model in models.items():
        if model.ByteSize() < PROTOBUF_LIMIT:
            onnx.save_model(model, str(folder / name))
        else:  # protobuf cannot hold it: the weights go beside it, then the file is checked by path
            onnx.save_model(model, str(folder / name), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=name + EXTERNAL_SUFFIX)
            onnx.checker.check_model(str(folder / name), full_check=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config_file(config, precision), indent=2, sort_keys=True),
                                      encoding="utf-8")
    (folder / GENERATION_FILE).write_text(json.dumps(generation_config(config), indent=2, sort_keys=True),
                                          encoding="utf-8")


def to_onnx(config: TransformerConfig, weights: Mapping[str, np.ndarray], path: str | os.PathLike,
            precision: str = "float32") -> Path:
    """Write the ONNX model directory ``path`` (the three graphs computing in ``precision``,
    `build_models`; ``config.json``, ``generation_config.json``), crash-safely: ``path`` is the old
    directory or the complete new one, and a failure (a refusal, ``onnx.checker``'s) leaves nothing
    behind. An existing ONNX export at ``path`` is replaced; any other existing file or directory is
    refused. Serve it with `twins.onnx_runtime` (or Optimum's ``ORTModelForSeq2SeqLM``:
    docs/formats/onnx.md)."""
    check_path(path)
    check_config(config)
    path = Path(path)
    check_replaceable(path, MODEL_FILES, "an ONNX export", lambda c: _is_export_config(c, path))
    precision = check_precision(precision, config.dtype)
    models = build_models(config, weights, precision)  # every refusal and check before anything is written
    import onnx

    return replace_directory(path, lambda staging: _write(onnx, models, config, precision, staging))


def _is_export_config(header: object, path: Path) -> bool:
    """Whether ``header``, the ``config.json`` at ``path``, is an export's: `config_file`'s keys
    (``format_version`` and ``precision``), or, for an export written before ``precision``
    existed (`export_precision` reads it as float32), ``format_version`` beside the three graphs.
    A neutral checkpoint's ``config.json`` also has ``format_version``: alone in a folder it is
    not an export, and that folder is not replaced."""
    return isinstance(header, dict) and "format_version" in header and (
        "precision" in header or all((path / name).is_file() for name in GRAPHS))


def read_onnx(path: str | os.PathLike) -> tuple[TransformerConfig, dict[str, Path]]:
    """An export's config (its ``config.json``) and ``{file name: path}`` of its three graphs;
    ``FileNotFoundError`` naming a missing directory or file, ``ValueError`` for a bad config."""
    check_path(path)  # named ('' was the current directory, None Python's TypeError)
    path = Path(path)
    recover(path)
    if not path.is_dir():
        raise FileNotFoundError(f"read_onnx: no ONNX export directory at {str(path)!r} (expected "
                                f"{', '.join(GRAPHS)} and {CONFIG_FILE})")
    missing = [str(path / n) for n in (*GRAPHS, CONFIG_FILE) if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(f"read_onnx: missing {', '.join(repr(m) for m in missing)}")
    return read_config_file(path / CONFIG_FILE), {name: path / name for name in GRAPHS}


def export_precision(path: str | os.PathLike) -> str:
    """What the export at ``path`` computes in: its ``config.json``'s ``precision`` ("float32"
    for an export written before float16 existed, which has none); ``ValueError`` naming the file
    for any other value. The graphs' own types say the same (`twins.onnx_runtime` reads them)."""
    check_path(path)  # named ('' read ./config.json, None was Python's TypeError)
    path = Path(path)
    if not all((path / name).is_file() for name in (*GRAPHS, CONFIG_FILE)):
        # a neutral checkpoint was "float32", a file Python's NotADirectoryError
        raise FileNotFoundError(f"export_precision: no ONNX export directory at {str(path)!r} (expected "
                                f"{', '.join(GRAPHS)} and {CONFIG_FILE})")
    config_json = path / CONFIG_FILE
    header = read_json(config_json)
    precision = header.get("precision", "float32") if isinstance(header, dict) else None
    if precision not in ("float32", "float16"):
        raise ValueError(f"{str(config_json)!r}: precision: expected 'float32' or 'float16', got {precision!r}")
    return precision
