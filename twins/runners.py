"""One adapter per implementation: load canonical weights, run a batch, return NumPy results.

Each framework is imported only when its runner is built, so `twins` works with either backend
missing (the runner then reports why it is unavailable).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from shared import TransformerConfig
from shared import reference

IMPLEMENTATIONS = ("reference", "torch", "tf")


class Unavailable(RuntimeError):
    """The implementation cannot run here (framework not installed, backend incomplete)."""


class Runner:
    """``trace(src, tgt)`` -> ordered dict of NumPy intermediates; ``logits(src, tgt)`` -> NumPy;
    ``greedy(src, max_len)`` -> `shared.decoding.GreedyResult` (None when the backend has none)."""

    name: str

    def __init__(self, name: str, trace_fn: Callable, logits_fn: Callable, greedy_fn: Callable | None = None):
        self.name, self._trace, self._logits, self._greedy = name, trace_fn, logits_fn, greedy_fn

    def greedy(self, src: np.ndarray, max_len: int):
        if self._greedy is None:
            raise Unavailable(f"{self.name} has no greedy_decode")
        return self._greedy(src, max_len)

    def trace(self, src: np.ndarray, tgt: np.ndarray) -> dict[str, np.ndarray]:
        return self._trace(src, tgt)

    def logits(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        return self._logits(src, tgt)

    def time_forward(self, src: np.ndarray, tgt: np.ndarray, repeats: int = 5) -> float:
        """Median seconds of a forward pass (no trace), after one warm-up call."""
        self._logits(src, tgt)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self._logits(src, tgt)
            times.append(time.perf_counter() - start)
        return float(np.median(times))


def _reference(config: TransformerConfig, weights: dict) -> Runner:
    def trace(src, tgt):
        return reference.forward(weights, config, src, tgt, return_trace=True)[1]

    model = reference.Model(weights, config)
    return Runner("reference", trace, lambda src, tgt: reference.forward(weights, config, src, tgt),
                  lambda src, max_len: reference.greedy_decode(model, src, max_len))


def _torch(config: TransformerConfig, weights: dict) -> Runner:
    try:
        import torch
        import torch_impl
        model = torch_impl.Transformer(config)
    except (ImportError, AttributeError) as err:
        raise Unavailable(f"torch backend unavailable: {err}") from None
    model.import_weights(weights)
    model.eval()

    def trace(src, tgt):
        with torch.no_grad():
            _, out = model(torch.from_numpy(src), torch.from_numpy(tgt), return_trace=True)
        return {k: v.cpu().numpy() for k, v in out.items()}

    def logits(src, tgt):
        with torch.no_grad():
            return model(torch.from_numpy(src), torch.from_numpy(tgt)).cpu().numpy()

    def greedy(src, max_len):
        return torch_impl.greedy_decode(model, torch.from_numpy(src), max_len)

    return Runner("torch", trace, logits, greedy if hasattr(torch_impl, "greedy_decode") else None)


def _tf(config: TransformerConfig, weights: dict) -> Runner:
    try:
        import tf_impl
        model = tf_impl.Transformer(config)
    except (ImportError, AttributeError) as err:
        raise Unavailable(f"tf backend unavailable: {err}") from None
    model.import_weights(weights)

    def trace(src, tgt):
        _, out = model(src, tgt, return_trace=True)
        return {k: np.asarray(v) for k, v in out.items()}

    import tensorflow as tf

    # Logits (and so the timing) through tf.function, as TF users run a model: eager Keras pays a
    # per-layer Python overhead that dwarfs a small model's arithmetic.
    compiled = tf.function(lambda src, tgt: model(src, tgt))

    def logits(src, tgt):
        return compiled(tf.constant(src), tf.constant(tgt)).numpy()

    greedy = getattr(tf_impl, "greedy_decode", None)
    return Runner("tf", trace, logits,
                  None if greedy is None else lambda src, max_len: greedy(model, src, max_len))


def make_runner(name: str, config: TransformerConfig, weights: dict) -> Runner:
    builders = {"reference": _reference, "torch": _torch, "tf": _tf}
    if name not in builders:
        raise ValueError(f"implementation: expected one of {IMPLEMENTATIONS}, got {name!r}")
    return builders[name](config, weights)
