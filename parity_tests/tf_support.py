"""Shared helpers of the TensorFlow tests: devices, TF32 off, building a model, and its logits in
each mode (``predict`` included). The backend-neutral interface built on it: `parity_tests.backends`.

Import it only after ``pytest.importorskip("tensorflow")``.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from shared import TransformerConfig  # noqa: E402
from shared.weights import random_weights  # noqa: E402

# TF enables TensorFloat-32 matmuls on Ampere+ GPUs by default: ~1e-3 relative error, which would
# swamp every float32 comparison; switched off before comparing (docs/design.md, tolerance policy).
tf.config.experimental.enable_tensor_float_32_execution(False)

import tf_impl  # noqa: E402

DEVICES: list[str] = ["/CPU:0"] + [f"/GPU:{i}" for i, _ in enumerate(tf.config.list_physical_devices("GPU"))]
MODES = ("eager", "function", "xla", "predict")


def build(config: TransformerConfig, weights: dict | None = None, seed: int = 0) -> tf_impl.Transformer:
    """A model with ``weights`` (default: `shared.weights.random_weights(config, seed)`) imported."""
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, seed) if weights is None else weights)
    return model


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


def _logits(model):
    def fn(src, tgt):
        return model(src, tgt)
    return fn
