"""One adapter per backend for the demo commands: build a model from canonical weights, train it with
the backend's own `training` module, decode with its `greedy_decode` / `beam_search`, and move the
weights and Adam's moments in and out in the canonical layout.

The frameworks are imported only when an adapter is built (`make_backend`), so ``twins train
--backend torch`` never imports TensorFlow and the other way round.

Adam's state is stored by canonical weight name, in the canonical layout (kernels ``(in, out)``):
``m.<name>`` (first moment) and ``v.<name>`` (second moment), plus the optimizer step. Both
backends' Adam (``torch.optim.Adam`` and tf_impl's ``KingmaBaAdam``) keep exactly these two moments
and apply the same bias corrections, so a run saved in one backend resumes in either.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from shared import TransformerConfig

BACKENDS = ("torch", "tf")


class Backend:
    """The interface the demo commands use (see `TorchBackend`, `TFBackend`)."""
    name: str
    config: TransformerConfig

    def make_optimizer(self, warmup: int, factor: float, step: int,
                       moments: Mapping[str, np.ndarray] | None) -> None: ...
    def train_step(self, batch, smoothing: float) -> tuple[float, float]: ...
    def greedy(self, src: np.ndarray, max_len: int) -> np.ndarray: ...
    def beam(self, src: np.ndarray, max_len: int, beam_size: int) -> np.ndarray: ...
    def export_weights(self) -> dict[str, np.ndarray]: ...
    def export_moments(self) -> dict[str, np.ndarray]: ...
    def trace(self, src: np.ndarray, tgt: np.ndarray) -> dict[str, np.ndarray]: ...


def _moment_names(names) -> list[str]:
    return [f"{kind}.{name}" for kind in ("m", "v") for name in names]


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], seed: int = 0,
                 threads: int | None = None):
        import torch
        import torch_impl
        from torch_impl import training, weights_io
        self._torch, self._impl, self._training, self._io = torch, torch_impl, training, weights_io
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)  # dropout
        self.config = config
        self.model = torch_impl.Transformer(config)
        self.model.import_weights(weights)
        self.model.eval()
        self.optimizer = None

    def make_optimizer(self, warmup, factor, step, moments=None):
        torch = self._torch
        self.optimizer = self._training.make_optimizer(self.model, warmup=warmup, factor=factor,
                                                       start_step=step)
        if moments is None:
            return
        for name, (param, transposed) in self._io.parameter_table(self.model).items():
            m, v = (np.asarray(moments[f"{k}.{name}"]) for k in ("m", "v"))
            as_param = (lambda a: torch.from_numpy(np.ascontiguousarray(a.T if transposed else a).copy())
                        .to(param.device, param.dtype))
            self.optimizer.state[param] = {"step": torch.tensor(float(step)), "exp_avg": as_param(m),
                                           "exp_avg_sq": as_param(v)}

    def train_step(self, batch, smoothing):
        result = self._training.train_step(self.model, self.optimizer, batch, smoothing)
        return result.loss, result.lr

    def greedy(self, src, max_len):
        return np.asarray(self._impl.greedy_decode(self.model, self._torch.from_numpy(src), max_len).tokens)

    def beam(self, src, max_len, beam_size):
        return np.asarray(self._impl.beam_search(self.model, self._torch.from_numpy(src), max_len,
                                                 beam_size=beam_size).tokens)

    def export_weights(self):
        return self.model.export_weights()

    def export_moments(self):
        out = {}
        table = self._io.parameter_table(self.model)
        for kind, key in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            for name, (param, transposed) in table.items():
                state = self.optimizer.state.get(param) if self.optimizer is not None else None
                if state and key in state:
                    a = state[key].detach().cpu().numpy()
                    out[f"{kind}.{name}"] = np.ascontiguousarray(a.T if transposed else a)
                else:
                    out[f"{kind}.{name}"] = np.zeros(tuple(reversed(param.shape)) if transposed
                                                     else tuple(param.shape), dtype=self.config.dtype)
        return out

    def trace(self, src, tgt):
        torch = self._torch
        self.model.eval()
        with torch.no_grad():
            _, out = self.model(torch.from_numpy(src), torch.from_numpy(tgt), return_trace=True)
        return {k: v.cpu().numpy() for k, v in out.items()}


class TFBackend(Backend):
    name = "tf"

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], seed: int = 0,
                 threads: int | None = None):
        import os
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras
        import tensorflow as tf
        if threads:
            try:  # only before TensorFlow's runtime starts (a second run in one process keeps the first)
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(threads)
            except RuntimeError:
                pass
        import tf_impl
        from tf_impl import training, weights_io
        self._tf, self._impl, self._training, self._io = tf, tf_impl, training, weights_io
        keras.utils.set_random_seed(seed)  # dropout
        self.config = config
        self.model = tf_impl.Transformer(config)
        self.model.import_weights(weights)
        self.optimizer = None
        if not hasattr(tf_impl, "greedy_decode"):
            raise ValueError("tf_impl has no greedy_decode in this version: the TF backend cannot decode")

    def make_optimizer(self, warmup, factor, step, moments=None):
        # With moments the optimizer's own step count carries the position (Adam's bias corrections
        # and the schedule both read it); without, only the schedule is offset and Adam starts fresh.
        self.optimizer = self._training.make_optimizer(
            self.model, warmup=warmup, factor=factor, start_step=0 if moments is not None else step)
        if moments is None:
            return
        opt = self.optimizer
        opt.iterations.assign(step)
        for name, variable in self._io.variable_table(self.model).items():
            index = opt._get_variable_index(variable)
            opt._momentums[index].assign(np.asarray(moments[f"m.{name}"], dtype=self.config.dtype))
            opt._velocities[index].assign(np.asarray(moments[f"v.{name}"], dtype=self.config.dtype))

    def train_step(self, batch, smoothing):
        result = self._training.train_step(self.model, self.optimizer, batch, smoothing)
        return result.loss, result.lr

    def greedy(self, src, max_len):
        return np.asarray(self._impl.greedy_decode(self.model, src, max_len).tokens)

    def beam(self, src, max_len, beam_size):
        return np.asarray(self._impl.beam_search(self.model, src, max_len, beam_size=beam_size).tokens)

    def export_weights(self):
        return self.model.export_weights()

    def export_moments(self):
        out = {}
        table = self._io.variable_table(self.model)
        opt = self.optimizer
        for kind in ("m", "v"):
            for name, variable in table.items():
                if opt is None:
                    out[f"{kind}.{name}"] = np.zeros(tuple(variable.shape), dtype=self.config.dtype)
                    continue
                slots = opt._momentums if kind == "m" else opt._velocities
                out[f"{kind}.{name}"] = np.asarray(slots[opt._get_variable_index(variable)].numpy())
        return out

    def trace(self, src, tgt):
        _, out = self.model(src, tgt, return_trace=True, training=False)
        return {k: np.asarray(v) for k, v in out.items()}


def make_backend(name: str, config: TransformerConfig, weights: Mapping[str, np.ndarray], seed: int = 0,
                 threads: int | None = None) -> Backend:
    """The adapter of ``name`` ("torch" or "tf") holding a model with ``weights``."""
    classes = {"torch": TorchBackend, "tf": TFBackend}
    if name not in classes:
        raise ValueError(f"--backend: expected one of {list(BACKENDS)}, got {name!r}")
    try:
        return classes[name](config, weights, seed, threads)
    except ImportError as err:
        extra = "torch" if name == "torch" else "tf-cpu"
        raise ValueError(f"the {name} backend is not installed ({err}); install the "
                         f"'{extra}' extra") from None


def moment_names(config: TransformerConfig) -> list[str]:
    from shared.weights import weight_schema
    return _moment_names(weight_schema(config))
