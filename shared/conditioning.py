"""How much each layer norm of a model magnifies the rounding of its input, read from the float64
oracle's trace: what the half-precision bounds of `shared.tolerances` grow with. NumPy only.

A layer norm divides its centred input by each row's spread, ``y = gamma * (x - mean) / s + beta``
with ``s`` the row's standard deviation (with eps, as `shared.reference.layer_norm` computes it).
An error ``dx`` in the input comes out, to first order, as ``gamma * dx / s`` less its projections
on the mean and on the normalised row. The comparison rule of `shared.tolerances` measures an error
against its tensor's scale ``max(max|.|, 1)``, so an input error of ``r`` times the input's scale
leaves the norm as about ``kappa * r`` times the output's scale at most (a first-order estimate for
the worst row, not a proof: the projections can add or take away a small factor), with

    kappa = max(max|x|, 1) * max|gamma| / (min over rows of s * max(max|y|, 1))

A row whose features spread little (``s`` small against the largest value of the tensor) makes
kappa large. In half precision the stream entering a norm carries the products' rounding (an
8-bit significand for bfloat16), and an ill-conditioned norm passes it on magnified: models of 8
or 10 features have kappa up to 7.7, the presets tiny and small up to 3.2 (benchmarks/
half_precision.py parity). kappa is a property of the model and its input, not of an
implementation, so it is read from the oracle's float64 trace and applies to every backend alike.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .config import TransformerConfig


def layer_norm_conditioning(x: np.ndarray, y: np.ndarray, gamma: np.ndarray, style: str, eps: float) -> float:
    """``kappa`` (the module docstring) of one layer norm: ``x`` its input and ``y`` its output,
    ``(..., d)`` each, ``gamma`` its ``(d,)`` scale; ``style`` and ``eps`` as the config's
    ``norm_style`` and ``norm_eps``. Every row counts, padding ones too (the comparison includes
    them). At least 0 and finite for finite input: the spread is at least ``sqrt(eps)``
    (``standard``) or ``eps`` (``annotated``)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim < 1 or x.shape[-1] < 2:
        raise ValueError(f"x, y: expected one shape (..., d) with d >= 2, got {x.shape} and {y.shape}")
    if x.size == 0:
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
