"""How much a model magnifies rounding, read from the float64 oracle's trace: what the bounds of
`shared.tolerances` grow with (`Bound.conditioned`, `trace_bounds`). Two measures, each a property
of the model and its input, not of an implementation, so they apply to every backend alike. NumPy
only.

**Layer norms** (the inference bounds of half precision and float32). A layer norm divides its
centred input by each row's spread, ``y = gamma * (x - mean) / s + beta`` with ``s`` the row's
standard deviation (with eps, as `shared.reference.layer_norm` computes it). An error ``dx`` in the
input comes out, to first order, as ``gamma * dx / s`` less its projections on the mean and on the
normalised row. The comparison rule of `shared.tolerances` measures an error against its tensor's
scale ``max(max|.|, 1)``, so an input error of ``r`` times the input's scale leaves the norm as
about ``kappa * r`` times the output's scale at most (a first-order estimate for the worst row, not
a proof: the projections can add or take away a small factor), with

    kappa = max(max|x|, 1) * max|gamma| / (min over rows of s * max(max|y|, 1))

A row whose features spread little (``s`` small against the largest value of the tensor) makes
kappa large. In half precision the stream entering a norm carries the products' rounding (an
8-bit significand for bfloat16), and an ill-conditioned norm passes it on magnified: models of 8
or 10 features have kappa up to 7.7, the presets tiny and small up to 3.2 (benchmarks/
half_precision.py parity). In float32 as well, past the 7.7 its bounds were measured at: models of
2 or 3 features reach kappa 180 to 3500 (`shared.tolerances.VARIANTS_CONDITIONING`).

**Attention scores** (the inference bounds of float32 and half precision). A softmax turns an
error ``ds`` in its scores into ``p * (ds - sum(p * ds))`` in its weights, and a score's error is
about its rounding, and its inputs' relative error, times the score: so a row passes on about
``sum_k p_k |s_k|`` times that relative error, and an attention's ``S`` is the largest such sum
over its rows (keys of negligible weight do not count; a row of one key passes on nothing).
The error of an earlier attention comes back through the queries and keys of a later one and is
multiplied again, so over a stack of attentions the excess grows faster than ``S``: the bounds
grow as ``S ** 1.5`` (`shared.tolerances.SCORE_EXPONENT`, measured in docs/performance.md,
"Bounds and attention scores"). Random weights reach ``S`` of 2.8 to 7.6, the demo models 33.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from . import reference
from .config import TransformerConfig


def layer_norm_conditioning(x: np.ndarray, y: np.ndarray, gamma: np.ndarray, style: str, eps: float) -> float:
    """``kappa`` (the module docstring) of one layer norm: ``x`` its input and ``y`` its output,
    ``(..., d)`` each, ``gamma`` its ``(d,)`` scale; ``style`` and ``eps`` as the config's
    ``norm_style`` and ``norm_eps``. Every row counts, padding ones too (the comparison includes
    them). At least 0 and finite for finite input: the spread is at least ``sqrt(eps)``
    (``standard``) or ``eps`` (``annotated``). 0.0 for a ``standard`` norm of one feature
    (``d_model=1``): a row centred on its own mean is 0 exactly, so the output is ``beta`` whatever
    the input and passes on none of its error (``annotated`` needs ``d >= 2``, as the config)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    least = 1 if style == "standard" else 2
    if x.shape != y.shape or x.ndim < 1 or x.shape[-1] < least:
        raise ValueError(f"x, y: expected one shape (..., d) with d >= {least} ({style!r} norm), "
                         f"got {x.shape} and {y.shape}")
    if x.size == 0 or x.shape[-1] == 1:
        return 0.0
    centred = x - x.mean(axis=-1, keepdims=True)
    if style == "standard":
        spread = np.sqrt((centred**2).mean(axis=-1) + eps)
    else:  # annotated: unbiased std, eps added to it (shared.reference.layer_norm)
        spread = x.std(axis=-1, ddof=1) + eps
    gain = float(np.max(np.abs(np.asarray(gamma, np.float64))))
    return max(float(np.max(np.abs(x))), 1.0) * gain / (float(spread.min()) * max(float(np.max(np.abs(y))), 1.0))


def norm_inputs(config: TransformerConfig, trace: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer norm's input, keyed by its trace name (``encoder.layers.0.self_attn_norm``,
    ``decoder.final_norm``), rebuilt from ``trace`` (`shared.reference.forward`'s, names in
    computation order). Pre-norm normalises the stream before the sublayer (the embedding or the
    last ``residual``); post-norm the stream plus the sublayer's ``output``; a final norm the
    stream. The sums are the oracle's own float64 sums, so each input is the one it normalised."""
    inputs, stream = {}, None
    for name, value in trace.items():
        if name.endswith(".embed") or name.endswith(".residual"):
            stream = value
        elif name.endswith("_norm"):
            if stream is None:
                raise ValueError(f"trace: expected an embed entry before {name!r}, got none (names in "
                                 "computation order, as shared.reference.forward returns them)")
            if config.norm_first or name.endswith(".final_norm"):
                inputs[name] = stream
            else:
                sublayer = name[:-len("_norm")]
                if f"{sublayer}.output" not in trace:
                    raise ValueError(f"trace: expected {sublayer}.output before {name!r} (post-norm), got none")
                inputs[name] = stream + trace[f"{sublayer}.output"]
    return inputs


def norm_conditioning(config: TransformerConfig, weights: Mapping[str, np.ndarray],
                      trace: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``kappa`` of every layer norm of the oracle's ``trace`` (`shared.reference.forward` with
    ``return_trace=True``) of the model ``config`` / ``weights``, keyed by the norm's trace name,
    in computation order."""
    return {name: layer_norm_conditioning(x, trace[name], weights[f"{name}.gamma"], config.norm_style,
                                          config.norm_eps)
            for name, x in norm_inputs(config, trace).items()}


def attention_inputs(config: TransformerConfig, trace: Mapping[str, np.ndarray]
                     ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each attention's query input ``(B, Q, d)``, memory ``(B, K, d)`` and the keys it allowed
    ``(B, H, Q, K)`` (bool), keyed by its weights' trace name (``decoder.layers.0.cross_attn.weights``),
    rebuilt from ``trace`` (`shared.reference.forward`'s, names in computation order). The query
    input is the normalised stream (pre-norm) or the stream (post-norm); cross-attention's memory
    is ``encoder.output``, self-attention's its query input. A key is allowed where the oracle's
    weight is above 0: a masked key gets exactly 0, and an allowed one only where ``exp``
    underflows (a score 745 below its row's largest), which then carries no weight to err in."""
    inputs, stream = {}, None
    for name, value in trace.items():
        if name.endswith(".embed") or name.endswith(".residual"):
            stream = value
        elif name.endswith("attn.weights"):
            sublayer = name[:-len(".weights")]
            query = trace.get(f"{sublayer}_norm") if config.norm_first else stream
            if query is None:
                raise ValueError(f"trace: expected the input of {sublayer} before {name!r}, got none "
                                 "(names in computation order, as shared.reference.forward returns them)")
            memory = trace.get("encoder.output") if ".cross_attn" in sublayer else query
            if memory is None:
                raise ValueError(f"trace: expected encoder.output before {name!r}, got none")
            inputs[name] = (query, memory, value > 0)
    return inputs


def attention_scores(config: TransformerConfig, weights: Mapping[str, np.ndarray],
                     trace: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``S`` (the module docstring) of every attention of the oracle's ``trace`` of the model
    ``config`` / ``weights``, keyed by its weights' trace name, in computation order: over the
    query rows that allowed two keys or more, the largest ``sum_k p_k |s_k|``, with ``s`` the
    scores ``q . k / sqrt(d_k)`` (recomputed in float64 as `shared.reference.attention` computes
    them) and ``p`` the oracle's weights. 0.0 where no row allowed two keys: a row of one key
    weighs it 1 whatever its score."""
    heads = config.n_heads
    width = config.head_dim if config.head_dim is not None else config.d_model // heads

    def project(x: np.ndarray, prefix: str) -> np.ndarray:  # (B, L, d) -> (B, H, L, d_k)
        y = np.asarray(x, np.float64) @ np.asarray(weights[f"{prefix}.kernel"], np.float64) \
            + np.asarray(weights[f"{prefix}.bias"], np.float64)
        return y.reshape(y.shape[0], y.shape[1], heads, width).transpose(0, 2, 1, 3)

    scores = {}
    for name, (query, memory, allowed) in attention_inputs(config, trace).items():
        sublayer = name[:-len(".weights")]
        s = project(query, f"{sublayer}.query") @ project(memory, f"{sublayer}.key").transpose(0, 1, 3, 2)
        mean = (np.asarray(trace[name], np.float64) * np.abs(s)).sum(axis=-1) / np.sqrt(width)  # (B, H, Q)
        scores[name] = float(np.max(mean, where=allowed.sum(axis=-1) >= 2, initial=0.0))
    return scores


def largest(config: TransformerConfig, weights: Mapping[str, np.ndarray],
            trace: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """``(kappa, S)``: the largest layer-norm conditioning and the largest attention score of the
    oracle's ``trace`` (0.0 where the model has none): what the bound of its last tensor, the
    logits, grows with (`shared.tolerances.Bound.conditioned`)."""
    f64 = {name: np.asarray(value, np.float64) for name, value in weights.items()}
    return (max(norm_conditioning(config, f64, trace).values(), default=0.0),
            max(attention_scores(config, f64, trace).values(), default=0.0))


def forward_conditioning(weights: Mapping[str, np.ndarray], config: TransformerConfig, src: np.ndarray,
                         tgt: np.ndarray) -> tuple[float, float]:
    """`largest` of the oracle's float64 pass of ``src`` ``(B, S)`` and ``tgt`` ``(B, T)``
    (default masks): for checks of a model's logits or log-probs (`twins convert --verify`, decode
    margins) that hold no trace of their own."""
    _, trace = reference.forward(weights, config, src, tgt, return_trace=True)
    return largest(config, weights, trace)
