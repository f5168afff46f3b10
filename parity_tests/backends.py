"""One test interface over every backend, so each contract test is written once.

A `Backend` is a framework (``torch`` / ``tf``), an execution mode and a device:

* ``torch`` on each of `torch_support.DEVICES` (CPU; CUDA when available), mode ``eager``;
* ``tf`` on each of `tf_support.DEVICES` in mode ``eager``, ``function`` (``tf.function``) or
  ``xla`` (``tf.function(jit_compile=True)``).

Every method takes and returns NumPy (ids ``(B, S)`` / ``(B, T)`` integer arrays; masks bool, True =
may attend, broadcastable to ``(B, H, q_len, k_len)``), converts at its boundary (back to NumPy
with the product's `twins.backends.to_numpy`), and runs the model the way that backend's users run
it. On GPU, TF32 is off in both frameworks (the support modules switch it off on import / build).
The decoding and checkpoint adapters (`parity_tests.decoding_backends.ModelBackend`,
`parity_tests.checkpoint_backends`) are built on this one.

Speed: models that tests only read come from `Backend.cached` (one per config, seed and device), and
a compiled backend keeps one ``tf.function`` per (model, kind), which retraces per input signature
only. Never mutate a cached model (no training, no import_weights).

Import this module freely: it imports a framework only when that framework is installed, and
`backends` lists only installed ones.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import pytest

from parity_tests.importable import present
from shared import TransformerConfig
from shared.weights import random_weights
from twins.backends import to_numpy

HAVE_TORCH, HAVE_TF = present("torch"), present("tf")

if HAVE_TORCH:
    import torch

    import torch_impl
    from parity_tests import torch_support
    from torch_impl import inputs as torch_inputs
    from torch_impl import training as torch_training
    from torch_impl import weights_io as torch_weights_io
if HAVE_TF:
    from parity_tests import tf_support  # first: switches TF32 off before any TF computation
    import tensorflow as tf

    import tf_impl
    from tf_impl import inputs as tf_inputs
    from tf_impl import training as tf_training
    from tf_impl import weights_io as tf_weights_io

# Kinds, for selecting backends: "torch", "tf-eager", "tf-function", "tf-xla".
EAGER = ("torch", "tf-eager")
COMPILED = ("tf-function", "tf-xla")
ALL = EAGER + COMPILED


@dataclass(frozen=True)
class Backend:
    framework: str  # "torch" | "tf"
    mode: str  # "eager" | "function" | "xla" (torch: always "eager")
    device: str  # torch: "cpu" / "cuda"; tf: "/CPU:0" / "/GPU:0"

    # -- naming ----------------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "torch" if self.framework == "torch" else f"tf-{self.mode}"

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.device.strip('/').replace(':0', '').lower()}"

    @property
    def pair(self) -> str:
        """This backend's key in `shared.tolerances.BOUNDS` against the float64 reference."""
        return f"{self.framework}:reference"

    @property
    def compiled(self) -> bool:
        return self.mode != "eager"

    @property
    def impl(self):
        return torch_impl if self.framework == "torch" else tf_impl

    @property
    def training(self):
        """The backend's training module (`torch_impl.training` / `tf_impl.training`)."""
        return torch_training if self.framework == "torch" else tf_training

    @property
    def inputs(self):
        """The backend's input checks and derived masks (`torch_impl.inputs` / `tf_impl.inputs`)."""
        return torch_inputs if self.framework == "torch" else tf_inputs

    # -- models ----------------------------------------------------------------------------------
    def build(self, config: TransformerConfig, weights: dict | None = None, seed: int = 0):
        """A fresh model (eval mode) on this device with ``weights`` (default
        ``random_weights(config, seed)``); the caller may mutate it."""
        return build_model(self.framework, self.device, config,
                      random_weights(config, seed) if weights is None else weights)

    def cached(self, config: TransformerConfig, seed: int = 0):
        """A shared read-only model per (framework, device, config, seed): never mutate it."""
        return _cached_model(self.framework, self.device if self.framework == "torch" else "",
                             config, seed)

    # -- conversions -----------------------------------------------------------------------------
    def tensor(self, array) -> Any:
        """``array`` (NumPy, or already this framework's tensor on any device: moved, never read
        back through NumPy) as this framework's tensor on this device, dtype unchanged."""
        if self.framework == "torch":
            return (array if isinstance(array, torch.Tensor) else torch.from_numpy(np.asarray(array))
                    ).to(self.device)
        with tf.device(self.device):
            return tf.identity(tf.constant(array))

    numpy = staticmethod(to_numpy)  # any tensor as NumPy on the host (bfloat16 widened to float32)

    def no_grad(self):
        """A context without autograd (torch); TF records nothing outside a tape."""
        return torch.no_grad() if self.framework == "torch" else contextlib.nullcontext()

    def placed(self):
        """Where this backend runs a call: torch without autograd, TF on its device."""
        return self.no_grad() if self.framework == "torch" else tf.device(self.device)

    def _masks(self, masks: dict) -> dict:
        return {k: (None if v is None else self.tensor(v)) for k, v in masks.items()}

    # -- running the model (NumPy in, NumPy out) -------------------------------------------------
    def logits(self, model, src, tgt, training: bool = False, **masks) -> np.ndarray:
        """Logits ``(B, T, V)`` of the plain call (torch: the fast SDPA path). ``training``: dropout
        on (torch: ``train()`` for this call, the previous mode restored)."""
        return self._run(model, "logits", src, tgt, training, masks)

    def trace(self, model, src, tgt, training: bool = False,
              **masks) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(logits, trace)`` with ``return_trace=True`` (torch: the explicit attention path);
        ``training`` as in `logits`."""
        trace = self._run(model, "trace", src, tgt, training, masks)
        return trace["logits"], trace

    def _run(self, model, kind: str, src, tgt, training: bool, masks: dict):
        masks, trace = self._masks(masks), kind == "trace"
        if self.framework == "torch":
            was = model.training
            model.train(training)
            try:
                with torch.no_grad():
                    out = model(self.tensor(src), self.tensor(tgt), return_trace=trace, **masks)
            finally:
                model.train(was)
        else:
            fn = self._function(model, "call", lambda s, t, sm, tm, trace, training: model(
                s, t, src_mask=sm, tgt_mask=tm, training=training, return_trace=trace))
            with tf.device(self.device):
                out = fn(self.tensor(src), self.tensor(tgt), masks.get("src_mask"),
                         masks.get("tgt_mask"), trace, training)
        return {k: to_numpy(v) for k, v in out[1].items()} if trace else to_numpy(out)

    def call(self, model, src, tgt, **masks):
        """The raw call on native tensors (for error tests: raises what the model raises)."""
        masks = self._masks(masks)
        with self.placed():
            return model(self.tensor(src), self.tensor(tgt), **masks)

    def pieces(self, model, src, tgt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(memory, generator(decode(tgt, memory, src_mask)), call(src, tgt))`` as NumPy, each
        computed in this backend's mode; the source mask is the framework's ``make_src_mask``."""
        def run(s, t):
            memory = model.encode(s)
            hidden = model.decode(t, memory, self.inputs.make_src_mask(s, model.config.pad_id))
            return memory, model.generator(hidden), model(s, t)

        with self.placed():
            out = self._function(model, "pieces", run)(self.tensor(src), self.tensor(tgt))
        assert dtype_name(out[1].dtype) == model.config.dtype
        if self.framework == "torch":
            assert out[1].device.type == torch.device(self.device).type
        return tuple(to_numpy(v) for v in out)

    def make_masks(self, src, tgt, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The framework's derived ``(src_mask, tgt_mask)`` as NumPy."""
        return (to_numpy(self.inputs.make_src_mask(self.tensor(src), pad_id)),
                to_numpy(self.inputs.make_tgt_mask(self.tensor(tgt), pad_id)))

    # -- gradients -------------------------------------------------------------------------------
    def probe_gradients(self, model, src, tgt, probe, return_trace: bool = False) -> dict[str, np.ndarray]:
        """The gradient of ``sum(logits * probe)`` for every canonical weight, in the canonical
        layout (kernels ``(in, out)``; a tied weight once, summed over its uses), computed in this
        backend's mode. torch: ``return_trace`` picks the explicit attention path."""
        if self.framework == "torch":
            table = torch_weights_io.weight_table(model)
            out = model(self.tensor(src), self.tensor(tgt), return_trace=return_trace)
            scalar = ((out[0] if return_trace else out) * self.tensor(probe)).sum()
            grads = torch.autograd.grad(scalar, [p for p, _ in table.values()])
            return {name: to_numpy(g.T if transposed else g)
                    for (name, (_, transposed)), g in zip(table.items(), grads)}
        table = tf_weights_io.weight_table(model)

        def run(s, t, p):
            with tf.GradientTape() as tape:
                out = model(s, t, return_trace=return_trace)
                scalar = tf.reduce_sum((out[0] if return_trace else out) * p)
            return [tf.convert_to_tensor(g) for g in tape.gradient(scalar, list(table.values()))]

        fn = self._function(model, f"grad-{return_trace}", run)
        with tf.device(self.device):
            grads = fn(self.tensor(src), self.tensor(tgt), self.tensor(probe))
        return {name: to_numpy(g) for name, g in zip(table, grads)}

    # -- compiled functions, one per (model, kind) -----------------------------------------------
    def _function(self, model, kind: str, fn: Callable) -> Callable:
        if self.mode == "eager":
            return fn
        # Kept in the model's own __dict__ (past Keras' attribute tracking), so the functions,
        # which close over the model, live and die with it.
        per_model = model.__dict__.setdefault("_parity_test_functions", {})
        key = (kind, self.mode)
        if key not in per_model:
            per_model[key] = tf.function(fn, jit_compile=(self.mode == "xla"))
        return per_model[key]


@functools.lru_cache(maxsize=None)
def cached_weights(config: TransformerConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """``random_weights(config, seed)``, drawn once (the base model's take ~1 s): read only."""
    return random_weights(config, seed)


# A few dozen configs; the base ones are 0.25-0.5 GB each, at most 4 (2 dtypes x 2 frameworks) a device.
@functools.lru_cache(maxsize=None)
def _cached_model(framework: str, device: str, config: TransformerConfig, seed: int):
    return build_model(framework, device, config, cached_weights(config, seed))


def build_model(framework: str, device: str, config: TransformerConfig, weights: dict | None = None):
    """A fresh model of ``framework`` in eval mode holding ``weights`` (None: the framework's own
    initialisation), torch's on ``device`` (TF places its variables itself)."""
    if framework == "torch":
        return torch_support.build(config, weights, device)
    model = tf_impl.Transformer(config)
    if weights is not None:
        model.import_weights(weights)
    return model


def _all() -> list[Backend]:
    out: list[Backend] = []
    if HAVE_TORCH:
        out += [Backend("torch", "eager", d) for d in torch_support.DEVICES]
    if HAVE_TF:
        out += [Backend("tf", m, d) for m in ("eager", "function", "xla") for d in tf_support.DEVICES]
    return out


BACKENDS: list[Backend] = _all()


def backends(kinds: Iterable[str] = EAGER, cpu_only: bool = False) -> list:
    """``pytest.param``s of the installed backends of ``kinds`` (see `ALL`), ids like
    ``torch-cpu`` / ``tf-xla-gpu``, for ``@pytest.mark.parametrize("backend", backends(...))``."""
    kinds = tuple(kinds)
    unknown = set(kinds) - set(ALL)
    if unknown:
        raise ValueError(f"kinds: expected some of {ALL}, got {sorted(unknown)}")
    return [pytest.param(b, id=b.id) for b in BACKENDS
            if b.kind in kinds and (not cpu_only or b.device.lower().strip("/").startswith("cpu"))]


def dtype_name(dtype) -> str:
    """``"float32"`` for a NumPy, torch, TF or Keras dtype (or a dtype's string)."""
    return str(getattr(dtype, "name", dtype)).removeprefix("torch.")


def eager_of(backend: Backend) -> Backend:
    """The eager backend of the same framework and device (what a compiled mode is compared to)."""
    return Backend(backend.framework, "eager", backend.device)
