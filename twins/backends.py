"""One adapter per implementation, the only way `twins` commands reach a model.

=============  ==================================  ==========================================
adapter        implementation                      imports, when built
=============  ==================================  ==========================================
`Reference`    the float64 NumPy oracle            `shared.reference` only (no framework)
`Torch`        torch_impl                          torch and torch_impl, never TensorFlow
`TF`           tf_impl                             TensorFlow, Keras and tf_impl, never torch
=============  ==================================  ==========================================

Every adapter takes and returns NumPy: token ids ``(B, S)`` / ``(B, T)`` integer arrays, results as
arrays. One interface (`Adapter`): ``trace``, ``logits``, ``time_forward``, ``greedy``, ``beam``,
``export_weights``; the two frameworks add training (``make_optimizer``, ``train_step``,
``export_moments``). Build one with `make_adapter` (a config and canonical weights) or
`load_adapter` (a checkpoint path); ``device`` (`shared.devices`: ``"cpu"``, the default, or
``"cuda[:N]"``) is where torch and tf compute, the reference being NumPy on the CPU and ONNX
Runtime served by its CPU provider. A framework is imported only when its adapter is built, so
``twins train --backend torch`` never imports TensorFlow; a framework that is not installed raises
`Unavailable` (an ``ImportError``, which the command line reports as an error). `to_numpy` brings
either framework's tensor back to NumPy.

Adam's moments travel in the canonical layout: ``m.<name>`` (first moment) and ``v.<name>`` (second
moment) for every canonical weight name, kernels ``(in, out)``, plus the optimizer's step count.
``torch.optim.Adam`` and tf_impl's Adam keep exactly these two moments with the same bias
corrections, so a run saved from one backend resumes in the other.
"""
from __future__ import annotations

import contextlib
import time
from typing import Mapping

import numpy as np

from shared import TransformerConfig
from shared.decoding import BeamResult, GreedyResult
from shared.devices import DEFAULT as CPU, parse_device, unavailable
from shared.precision import check_precision

IMPLEMENTATIONS = ("reference", "torch", "tf")
BACKENDS = ("torch", "tf")  # the implementations that train
_EXTRAS = {"torch": "torch", "tf": "tf-cpu", "onnx": "onnx"}  # the pyproject extra that installs each
DECODERS = BACKENDS + ("onnx",)  # what `twins decode --backend` runs: ONNX Runtime serves, it does not train
COMPARED = DECODERS  # what `twins compare --backends` runs beside the reference (onnx: logits only)

Weights = Mapping[str, np.ndarray]


def _median_seconds(call, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``call()``, after one untimed call (warm-up)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


class Unavailable(ImportError):
    """The implementation cannot run here: its framework is not installed."""

    def __init__(self, name: str, err: ImportError):
        super().__init__(f"the {name} backend is not installed ({err}); install the "
                         f"'{_EXTRAS[name]}' extra")


class Adapter:
    """The interface every command uses. All arrays are NumPy; every call runs in eval mode
    (dropout off), whatever training did before."""

    name: str
    config: TransformerConfig

    def trace(self, src: np.ndarray, tgt: np.ndarray) -> dict[str, np.ndarray]:
        """Every named intermediate of a forward pass (`shared.reference.trace_names` order)."""
        raise NotImplementedError

    def logits(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        """``(B, T, tgt_vocab)`` logits of a forward pass, default masks."""
        raise NotImplementedError

    def greedy(self, src: np.ndarray, max_len: int) -> GreedyResult:
        """Greedy decoding (`shared.decoding`) of ``src (B, S)``, at most ``max_len`` new tokens."""
        raise NotImplementedError

    def beam(self, src: np.ndarray, max_len: int, beam_size: int,
             length_penalty: float = 0.0) -> BeamResult:
        """Beam search (`shared.decoding`) with ``beam_size`` beams and GNMT ``length_penalty``."""
        raise NotImplementedError

    def export_weights(self) -> dict[str, np.ndarray]:
        """The canonical weights the adapter holds now."""
        raise NotImplementedError

    def _timed_forward(self, src: np.ndarray, tgt: np.ndarray) -> None:
        self.logits(src, tgt)

    def time_forward(self, src: np.ndarray, tgt: np.ndarray, repeats: int = 5) -> float:
        """Median seconds of a forward pass (no trace), after one warm-up call."""
        return _median_seconds(lambda: self._timed_forward(src, tgt), repeats)


# -- the oracle -----------------------------------------------------------------------------------
class Reference(Adapter):
    """`shared.reference` in float64 arithmetic; it has no training."""

    name = "reference"

    def __init__(self, config: TransformerConfig, weights: Weights):
        from shared import reference
        self._reference = reference
        self.config, self._weights = config, dict(weights)
        self._model = reference.Model(self._weights, config)

    @classmethod
    def from_weights(cls, config: TransformerConfig, weights: Weights, seed: int | None = None,
                     threads: int | None = None, device: str = CPU) -> "Reference":
        # NumPy on the CPU, whatever device the backends compute on: nothing random to seed, no
        # thread pool to size
        return cls(config, weights)

    @classmethod
    def from_checkpoint(cls, path, config: TransformerConfig | None = None, seed: int | None = None,
                        threads: int | None = None, device: str = CPU) -> "Reference":
        """From a checkpoint in any format `shared.formats` reads (a framework's file needs that
        framework to be read); a ``config``, when given, must be the one the file holds."""
        from shared import formats
        from shared.weights import config_differences
        held, weights = formats.read(path)
        if config is not None and config != held:
            raise ValueError(f"config: expected the config of {str(path)!r}, got another "
                             f"({config_differences(config, held)})")
        return cls(held, weights)

    def trace(self, src, tgt):
        return self._reference.forward(self._weights, self.config, src, tgt, return_trace=True)[1]

    def logits(self, src, tgt):
        return self._reference.forward(self._weights, self.config, src, tgt)

    def greedy(self, src, max_len):
        return self._reference.greedy_decode(self._model, src, max_len)

    def beam(self, src, max_len, beam_size, length_penalty=0.0):
        return self._reference.beam_search(self._model, src, max_len, beam_size=beam_size,
                                           length_penalty=length_penalty)

    def export_weights(self):
        return dict(self._weights)


# -- the two frameworks ---------------------------------------------------------------------------
class _Framework(Adapter):
    """What the torch and TF adapters share: a model of the backend ``impl`` (torch_impl or
    tf_impl), built from weights or loaded from a file, with decoding and training."""

    def __init__(self, impl, model, training):
        """``impl``: the backend package; ``model``: its Transformer; ``training``: its training
        module (make_optimizer, train_step)."""
        self._impl, self._training, self.model, self.config = impl, training, model, model.config
        self.optimizer, self.parallel, self.device = None, None, CPU
        self._scope = contextlib.nullcontext  # what every call of the model runs in (`_place`)

    @classmethod
    def _setup(cls, seed: int | None, threads: int | None, device: str = CPU):
        """Import the framework (`Unavailable` if missing), size its thread pool, seed its dropout
        and make ``device`` the one it computes on (a ValueError naming ``device`` if it sees no
        such device), TF32 off on a GPU (`shared.devices`); returns the backend package. Runs
        before any model is built: TensorFlow fixes its thread pools and devices when its runtime
        starts."""
        raise NotImplementedError

    @classmethod
    def _scope_of(cls, device: str):
        """What makes the context a model on ``device`` is built and called in, decided once
        (torch: none, the model is moved; TF: ``tf.device``): a function of no argument."""
        return contextlib.nullcontext

    def _place(self, device: str) -> None:
        """Put the model on ``device`` (`_setup` has checked it); every later call runs there."""
        self.device = device
        self._scope = self._scope_of(device)

    @classmethod
    def from_weights(cls, config: TransformerConfig, weights: Weights, seed: int | None = None,
                     threads: int | None = None, workers: int | None = None, device: str = CPU):
        """A model of ``config`` holding the canonical ``weights``, on ``device``. ``seed`` seeds
        dropout (None: leave the framework's generator as it is); ``threads`` sizes the CPU thread
        pool; ``workers`` (None: one process, no engine) trains data-parallel on the backend's
        ``distributed.DataParallel`` (torch: this process is one of torchrun's workers; CPU
        processes only)."""
        if workers is not None and device != CPU:
            raise ValueError(f"device: data-parallel training (workers={workers}) runs on CPU "
                             f"processes, got {device!r}")
        impl = cls._setup(seed, threads, device)
        if workers is None:
            with cls._scope_of(device)():
                model = impl.Transformer(config)
                model.import_weights(weights)
            adapter = cls(impl, model)
            adapter._place(device)
            return adapter
        parallel = cls._distributed().DataParallel(config, weights, workers)
        adapter = cls(impl, parallel.model)
        adapter.parallel = parallel
        return adapter

    @classmethod
    def _distributed(cls):
        """The backend's ``distributed`` module."""
        raise NotImplementedError

    @classmethod
    def from_checkpoint(cls, path, config: TransformerConfig | None = None, seed: int | None = None,
                        threads: int | None = None, device: str = CPU):
        """A model loaded by the backend's own `load_checkpoint` (a neutral directory or its native
        file), on ``device``; ``config`` only for a native file that holds none."""
        impl = cls._setup(seed, threads, device)
        with cls._scope_of(device)():
            adapter = cls(impl, impl.load_checkpoint(path, config))
        adapter._place(device)
        return adapter

    def set_precision(self, precision: str) -> str:
        """Forward passes, training and decoding in ``precision`` ("float32", or "bfloat16" /
        "float16" mixed precision: `shared.precision`); returns the previous one."""
        with self._scope():
            return self._precision().set_precision(self.model, precision)

    def _precision(self):
        raise NotImplementedError

    def greedy(self, src, max_len):
        with self._scope():
            return self._impl.greedy_decode(self.model, self._ids(src), max_len)

    def beam(self, src, max_len, beam_size, length_penalty=0.0):
        with self._scope():
            return self._impl.beam_search(self.model, self._ids(src), max_len, beam_size=beam_size,
                                          length_penalty=length_penalty)

    def export_weights(self):
        return self.model.export_weights()

    def _ids(self, ids: np.ndarray):
        return ids

    # training: the backend's own `training` module
    def make_optimizer(self, warmup: int, factor: float, step: int,
                       moments: Mapping[str, np.ndarray] | None = None) -> None:
        """Adam on the Noam schedule (``warmup``, ``factor``), continuing at ``step``; with
        ``moments`` (canonical layout, `shared.moments.moment_names`) Adam resumes exactly where
        it stopped, without them it starts from zero moments."""
        # The schedule starts after ``step``; imported moments place Adam's count and the schedule
        # at ``step`` again, in both backends (docs/design.md, convention 13).
        if self.parallel is not None:
            self.optimizer = self.parallel.make_optimizer(warmup=warmup, factor=factor, start_step=step)
        else:
            with self._scope():
                self.optimizer = self._training.make_optimizer(self.model, warmup=warmup, factor=factor,
                                                               start_step=step)
        if moments is not None:
            with self._scope():
                self._training.import_moments(self.model, self.optimizer, moments, step)

    def train_step(self, batch, smoothing: float) -> tuple[float, float]:
        """One update on ``batch = (src, tgt_in, tgt_out)``: ``(loss before it, learning rate)``.
        Data-parallel: ``batch`` is the global batch; the loss is the global batch's."""
        if self.parallel is not None:
            result = self.parallel.train_step(batch, smoothing)
        else:
            with self._scope():
                result = self._training.train_step(self.model, self.optimizer, batch, smoothing)
        return result.loss, result.lr

    def export_moments(self) -> dict[str, np.ndarray]:
        """Adam's moments in the canonical layout; zeros for a weight that has none yet (the
        backend's ``training.export_moments``)."""
        return self._training.export_moments(self.model, self.optimizer)


def to_numpy(tensor) -> np.ndarray:
    """A torch or TF tensor (on any device), or an array, as a NumPy array on the host; bfloat16,
    which NumPy lacks, widened exactly to float32."""
    if hasattr(tensor, "detach"):  # torch: off the autograd graph and the device first
        tensor = tensor.detach().cpu()
        tensor = tensor.float() if str(tensor.dtype) == "torch.bfloat16" else tensor
        return tensor.numpy()
    array = np.asarray(tensor)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


class Torch(_Framework):
    name = "torch"

    @classmethod
    def _setup(cls, seed, threads, device=CPU):
        kind, index = parse_device(device)
        try:
            import torch
            import torch_impl
        except ImportError as err:
            raise Unavailable("torch", err) from None
        if kind == "cuda":
            gpus = torch.cuda.device_count()
            if index >= gpus:
                raise ValueError(unavailable("device", device, f"torch {torch.__version__}", gpus))
            torch.backends.cuda.matmul.allow_tf32 = False  # (torch's default; a caller's may differ)
            torch.backends.cudnn.allow_tf32 = False
        if threads:
            torch.set_num_threads(threads)
        if seed is not None:
            torch.manual_seed(seed)  # dropout
        return torch_impl

    def _place(self, device):
        super()._place(device)
        self.model.to(device)

    @classmethod
    def _distributed(cls):
        from torch_impl import distributed
        return distributed

    def _precision(self):
        from torch_impl import precision
        return precision

    def __init__(self, impl, model):
        import torch
        from torch_impl import training
        super().__init__(impl, model, training)
        self._torch = torch
        model.eval()

    def _ids(self, ids):
        return self._torch.from_numpy(ids).to(self.device)

    def trace(self, src, tgt):
        self.model.eval()  # training leaves the model in train mode
        with self._torch.no_grad():
            _, out = self.model(self._ids(src), self._ids(tgt), return_trace=True)
        return {k: to_numpy(v) for k, v in out.items()}

    def logits(self, src, tgt):
        self.model.eval()
        with self._torch.no_grad():
            return to_numpy(self.model(self._ids(src), self._ids(tgt)))


class TF(_Framework):
    name = "tf"

    @classmethod
    def _setup(cls, seed, threads, device=CPU):
        import os
        kind, index = parse_device(device)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            import tf_impl  # first: it loads triton before TensorFlow (shared/load_order.py)
            import keras
            import tensorflow as tf
        except ImportError as err:
            raise Unavailable("tf", err) from None
        if threads:
            try:  # only before TensorFlow's runtime starts (a second run in one process keeps the first)
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(threads)
            except RuntimeError:
                pass
        cls._check_device(tf, device, kind, index)
        if seed is not None:
            keras.utils.set_random_seed(seed)  # dropout
        # Keras re-raises an error from inside `call` as a new one, its text wrapped in "Exception
        # encountered when calling ..." and terminal colour codes; without the filtering, tf_impl's
        # own error (the text torch_impl and the reference raise) reaches the caller unchanged.
        keras.config.disable_traceback_filtering()
        return tf_impl

    @staticmethod
    def _check_device(tf, device: str, kind: str, index: int | None) -> None:
        """A GPU that TensorFlow sees, or the CPU; TF32 off wherever it sees a GPU."""
        gpus = tf.config.list_physical_devices("GPU")
        if kind == "cuda" and index >= len(gpus):
            raise ValueError(unavailable("device", device, f"TensorFlow {tf.__version__}", len(gpus)))
        if gpus:
            tf.config.experimental.enable_tensor_float_32_execution(False)

    @classmethod
    def _scope_of(cls, device):
        """``tf.device`` of ``device`` (TensorFlow puts an operation with no device on the first
        GPU it sees, so the CPU is named too where there is one): the variables are made and every
        call runs in it, as the TF tests choose a device; no scope on a machine without a GPU."""
        import tensorflow as tf
        kind, index = parse_device(device)
        if kind == "cpu" and not tf.config.list_physical_devices("GPU"):
            return contextlib.nullcontext
        name = "/CPU:0" if kind == "cpu" else f"/GPU:{index}"
        return lambda: tf.device(name)

    @classmethod
    def _distributed(cls):
        from tf_impl import distributed
        return distributed

    def _precision(self):
        from tf_impl import precision
        return precision

    def __init__(self, impl, model):
        import tensorflow as tf
        from tf_impl import training
        super().__init__(impl, model, training)
        self._tf, self._compiled = tf, None

    def trace(self, src, tgt):
        with self._scope():
            _, out = self.model(src, tgt, return_trace=True, training=False)
        return {k: to_numpy(v) for k, v in out.items()}

    def logits(self, src, tgt):
        with self._scope():
            return to_numpy(self.model(src, tgt, training=False))

    def _timed_forward(self, src, tgt):
        # Timed under tf.function, as TF users run a model: eager Keras pays a per-layer Python
        # overhead that dwarfs a small model's arithmetic. (`logits` stays eager, like `trace`.)
        tf = self._tf
        if self._compiled is None:
            self._compiled = tf.function(lambda s, t: self.model(s, t, training=False))
        with self._scope():
            self._compiled(tf.constant(src), tf.constant(tgt)).numpy()


class OnnxRuntime:
    """ONNX Runtime serving the ONNX export of a model (`twins.onnx_runtime`; imports neither torch
    nor TensorFlow): decoding and logits, no trace or training. Built from canonical weights (the
    export made in memory: needs ``onnx`` and ``onnxruntime``; `set_precision` "float16" rebuilds
    it as a float16 export) or loaded from an export directory (``onnxruntime`` alone: it computes
    in the precision it was exported in)."""

    def __init__(self, model, weights: Weights | None = None):
        self.model, self._weights = model, weights

    @staticmethod
    def _runtime():
        try:
            from . import onnx_runtime
            import onnxruntime  # noqa: F401  (onnx_runtime imports it lazily: fail here, named)
        except ImportError as err:
            raise Unavailable("onnx", err) from None
        return onnx_runtime

    @staticmethod
    def _check_device(device: str) -> None:
        if parse_device(device)[0] != "cpu":
            raise ValueError(f"device: the onnx backend runs on ONNX Runtime's CPU provider, got {device!r}")

    @classmethod
    def from_weights(cls, config: TransformerConfig, weights: Weights, seed: int | None = None,
                     threads: int | None = None, device: str = CPU) -> "OnnxRuntime":
        cls._check_device(device)
        return cls(cls._runtime().OnnxRuntimeModel.from_weights(config, weights, threads=threads), weights)

    @classmethod
    def load(cls, path, threads: int | None = None, device: str = CPU) -> "OnnxRuntime":
        """An ONNX export directory (`shared.formats.onnx.is_export`)."""
        cls._check_device(device)
        return cls(cls._runtime().OnnxRuntimeModel.load(path, threads=threads))

    @property
    def config(self) -> TransformerConfig:
        return self.model.config

    def set_precision(self, precision: str) -> str:
        """The export's own precision (float32: the model's dtype, or float16); an in-memory
        export (`from_weights`) is rebuilt in float16 when asked. Anything else is refused by name
        (bfloat16: `shared.exporters.onnx.refusals`); returns the previous one."""
        name = check_precision(precision, self.config.dtype)
        previous = self.model.precision
        if name == previous:
            return previous
        if self._weights is not None and name != "bfloat16":
            model = self.model
            self.model = type(model).from_weights(self.config, self._weights, threads=model.threads,
                                                  precision=name)
            return previous
        graphs = self.config.dtype if previous == "float32" else previous
        hint = ("bfloat16 is not exported: ONNX Runtime's CPU has no bfloat16 kernels" if name == "bfloat16"
                else "export one with twins convert --to onnx --precision float16" if name == "float16"
                else "export the float32 model with twins convert --to onnx")
        raise ValueError(f"precision: ONNX Runtime runs the export's {graphs} graphs, got {precision!r} ({hint})")

    def greedy(self, src, max_len):
        return self.model.greedy(src, max_len)

    def beam(self, src, max_len, beam_size, length_penalty=0.0):
        return self.model.beam(src, max_len, beam_size=beam_size, length_penalty=length_penalty)

    def logits(self, src, tgt):
        return self.model.logits(src, tgt)

    def trace(self, src, tgt) -> dict[str, np.ndarray]:
        """Only the logits: the export's graphs name no other intermediate of the trace."""
        return {"logits": self.logits(src, tgt)}

    def time_forward(self, src, tgt, repeats: int = 5) -> float:
        """Median seconds of one forward pass (encoder and decoder sessions), after a warm-up."""
        return _median_seconds(lambda: self.logits(src, tgt), repeats)


_ADAPTERS = {"reference": Reference, "torch": Torch, "tf": TF, "onnx": OnnxRuntime}


def _adapter_class(name: str):
    if name not in _ADAPTERS:
        raise ValueError(f"implementation: expected one of {IMPLEMENTATIONS}, got {name!r}")
    return _ADAPTERS[name]


def make_adapter(name: str, config: TransformerConfig, weights: Weights, seed: int | None = None,
                 threads: int | None = None, workers: int | None = None, device: str = CPU) -> Adapter:
    """The adapter of implementation ``name`` (one of `IMPLEMENTATIONS`) holding ``weights``;
    ``workers``: train data-parallel (torch and tf only; see `_Framework.from_weights`);
    ``device``: where torch and tf compute (the reference computes on the CPU whatever it is)."""
    if workers is None:
        return _adapter_class(name).from_weights(config, weights, seed, threads, device=device)
    if name not in BACKENDS:
        raise ValueError(f"workers: only {BACKENDS} train, got implementation {name!r}")
    return _adapter_class(name).from_weights(config, weights, seed, threads, workers, device=device)


def prepare(name: str, seed: int | None = None, threads: int | None = None):
    """Import backend ``name`` (`Unavailable` if missing), size its thread pool and seed it, before
    any model exists (TensorFlow fixes its thread pools and devices when its runtime starts);
    returns the backend package."""
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")
    return _adapter_class(name)._setup(seed, threads)


def distributed(name: str, threads: int | None = None):
    """Backend ``name``'s ``distributed`` module, the framework set up first (`prepare`: thread
    pools before TensorFlow's runtime starts)."""
    prepare(name, threads=threads)
    return _adapter_class(name)._distributed()


def saved_model_report(model, path, src: np.ndarray) -> dict[str, dict[str, bool]]:
    """`tf_impl.saved_model.compare_export` of a tf_impl ``model`` and the SavedModel at ``path``
    on source ids ``src (B, S)`` (``twins convert --to saved-model --verify``)."""
    prepare("tf")
    from tf_impl.saved_model import compare_export
    return compare_export(model, path, src)


def load_adapter(name: str, path, config: TransformerConfig | None = None, seed: int | None = None,
                 threads: int | None = None, device: str = CPU) -> Adapter:
    """The adapter of implementation ``name`` loaded from the checkpoint at ``path`` by that
    implementation itself (any format `shared.formats` reads), on ``device`` (torch and tf)."""
    return _adapter_class(name).from_checkpoint(path, config, seed, threads, device=device)
