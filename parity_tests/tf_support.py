"""Shared helpers of the TensorFlow tests: devices, TF32 off, and running a model in each mode.

Import it only after ``pytest.importorskip("tensorflow")``.
"""
from __future__ import annotations

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from shared import TransformerConfig  # noqa: E402
from shared.weights import random_weights  # noqa: E402

# TF enables TensorFloat-32 matmuls on Ampere+ GPUs by default: ~1e-3 relative error, which would
# swamp every float32 comparison. DESIGN: switched off before comparing.
tf.config.experimental.enable_tensor_float_32_execution(False)

import tf_impl  # noqa: E402

DEVICES: list[str] = ["/CPU:0"] + [f"/GPU:{i}" for i, _ in enumerate(tf.config.list_physical_devices("GPU"))]
MODES = ("eager", "function", "xla", "predict")


def build(config: TransformerConfig, weights: dict | None = None, seed: int = 0) -> tf_impl.Transformer:
    """A model with ``weights`` (default: `shared.weights.random_weights(config, seed)`) imported."""
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, seed) if weights is None else weights)
    return model


@functools.lru_cache(maxsize=None)
def cached(config: TransformerConfig, seed: int = 0) -> tf_impl.Transformer:
    """One model per (config, seed) for tests that only read it (never modify a cached model)."""
    return build(config, seed=seed)


def to_numpy(trace: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in trace.items()}


def run_trace(model: tf_impl.Transformer, src: np.ndarray, tgt: np.ndarray, device: str = "/CPU:0",
              mode: str = "eager", **kwargs) -> dict[str, np.ndarray]:
    """The model's trace (same names as `shared.reference`) as NumPy, computed on ``device`` in ``mode``:
    ``eager``, ``function`` (``tf.function``) or ``xla`` (``tf.function(jit_compile=True)``)."""
    with tf.device(device):
        if mode == "eager":
            _, trace = model(src, tgt, return_trace=True, **kwargs)
        else:
            fn = tf.function(_traced(model, kwargs), jit_compile=(mode == "xla"))
            trace = fn(tf.constant(src), tf.constant(tgt))
    return to_numpy(trace)


def run_logits(model: tf_impl.Transformer, src: np.ndarray, tgt: np.ndarray, device: str = "/CPU:0",
               mode: str = "eager") -> np.ndarray:
    """Logits as NumPy in one of `MODES` (``predict`` goes through ``keras.Model.predict``)."""
    with tf.device(device):
        if mode == "predict":
            return model.predict({"src": src, "tgt": tgt}, verbose=0)
        if mode == "eager":
            return np.asarray(model(src, tgt))
        fn = tf.function(_logits(model), jit_compile=(mode == "xla"))
        return np.asarray(fn(tf.constant(src), tf.constant(tgt)))


def _traced(model, kwargs):
    def fn(src, tgt):
        return model(src, tgt, return_trace=True, **kwargs)[1]
    return fn


def _logits(model):
    def fn(src, tgt):
        return model(src, tgt)
    return fn
