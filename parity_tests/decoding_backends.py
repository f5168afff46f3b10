"""The backends of the decoding contract suite, behind one interface each, and their fixtures.

Two levels, as decoding has two:

* `SearchBackend`: the search loops alone (`shared.decoding`, `torch_impl.search`,
  `tf_impl.search`) driven by a NumPy `shared.decoding.Step` (the stub tables of
  test_decoding_stub). Each backend adapts that step to its own tensors, so one table and one
  hand-derived answer serve every backend. Names: ``reference`` (the NumPy spec), ``torch``,
  ``tf-eager``, ``tf-function`` (inside ``tf.function``, the NumPy step through
  ``tf.numpy_function``) and, for steps written in TF ops only (`SearchBackend.markov`),
  ``tf-xla``.
* `ModelBackend`: the model-level API (``greedy_decode`` / ``beam_search`` of torch_impl and
  tf_impl). Names: ``torch`` (and ``torch-cuda`` where a GPU is present), ``tf-eager``
  (``compiled=False``), ``tf-function`` (``compiled=True, jit_compile=False``), ``tf-xla``.

Tracing a TF loop costs about a second (XLA: several), so TF models are built once per (variant,
dtype) and given each test's weights by ``import_weights`` (their compiled loops are kept with
them), and compiled table loops are traced once per shape and reused with another table. The
model-level cases and the memoised decodes are in `parity_tests.decoding_cases`.
Fixtures: ``search_backend`` (parametrized over `SEARCH_BACKENDS`) and ``model_backend`` (over
`MODEL_BACKENDS`); a test module imports the ones it uses.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from parity_tests.backends import HAVE_TF, HAVE_TORCH, Backend
from shared import TransformerConfig
from shared import decoding as D
from shared.weights import random_weights

if HAVE_TORCH:
    import torch

    from parity_tests.torch_support import DEVICES as TORCH_DEVICES
    from torch_impl import search as torch_search
if HAVE_TF:
    import tensorflow as tf

    import tf_impl
    from tf_impl import search as tf_search

SEARCH_BACKENDS = ["reference", "torch", "tf-eager", "tf-function"]
NATIVE_SEARCH_BACKENDS = SEARCH_BACKENDS + ["tf-xla"]  # steps written in each backend's own ops


# -- the search loops -----------------------------------------------------------------------------
class TorchAdapter:
    """A NumPy `shared.decoding.Step` as a torch step: prefixes and rows go to NumPy, log-probs
    come back as tensors (logits) in ``dtype`` (the table's, float64, unless told)."""

    def __init__(self, step, dtype=None):
        self.step, self.vocab = step, step.vocab
        self.dtype = dtype or torch.from_numpy(np.zeros(0, step.dtype)).dtype

    def initial_state(self):
        return self.step.initial_state()

    def __call__(self, prefixes, t, state):
        out, state = self.step(prefixes.cpu().numpy().copy(), t, state)
        return torch.from_numpy(np.array(out)), state

    def reorder(self, state, rows):
        return self.step.reorder(state, rows.cpu().numpy())


class TFAdapter:
    """A NumPy `shared.decoding.Step` without state as a TF step: called directly eagerly, through
    ``tf.numpy_function`` inside a ``tf.function``, which looks ``self.step`` up when it runs, so
    one compiled loop serves every table of one shape (`_compiled_greedy`, `_compiled_beam`)."""

    def __init__(self, step, vocab: int, dtype):
        self.step, self.vocab, self.dtype = step, vocab, tf.as_dtype(dtype)

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        if tf.executing_eagerly():
            out, _ = self.step(prefixes.numpy(), int(t), self.step.initial_state())
            return tf.constant(out), state
        run = lambda p, step: self.step(p, int(step), ())[0]  # noqa: E731  (self.step looked up late)
        return tf.numpy_function(run, [prefixes, t], self.dtype, stateful=True), state

    def reorder(self, state, rows):
        return state


@functools.lru_cache(maxsize=None)
def _table_step(vocab: int, dtype: str) -> TFAdapter:
    """The one TF step of every compiled table loop of (vocab, dtype): tables swap its ``step``."""
    return TFAdapter(None, vocab, dtype)


@functools.lru_cache(maxsize=None)
def _compiled_greedy(vocab, dtype, *args):
    return tf.function(lambda: tf_search.greedy_loop(_table_step(vocab, dtype), *args), autograph=False)


@functools.lru_cache(maxsize=None)
def _compiled_beam(vocab, dtype, *args):
    return tf.function(lambda alpha: tf_search.beam_loop(_table_step(vocab, dtype), *args,
                                                         length_penalty=alpha), autograph=False)


class SearchBackend:
    """``greedy_search`` / ``beam_search`` with the signature of `shared.decoding`'s, run by one
    backend on a NumPy step; ``dtype`` (a NumPy dtype name) is the dtype the backend's step
    declares (the table's logits are cast to it)."""

    def __init__(self, name: str):
        self.name = name
        self.framework = name.split("-")[0]

    def __repr__(self) -> str:
        return self.name

    def _eager(self, step):
        """(the search module, ``step`` as its step) of ``torch`` or ``tf-eager``."""
        if self.name == "torch":
            return torch_search, TorchAdapter(step)
        return tf_search, TFAdapter(step, step.vocab, step.dtype)

    @staticmethod
    def _table(step) -> TFAdapter:
        """The compiled loops' one step of ``step``'s shape, now reading ``step``."""
        table = _table_step(step.vocab, np.dtype(step.dtype).name)
        table.step = step
        return table

    def greedy_search(self, step, batch, max_len, bos_id, eos_id, pad_id) -> D.GreedyResult:
        args = (batch, max_len, bos_id, eos_id, pad_id)
        if self.name == "reference":
            return D.greedy_search(step, *args)
        if self.name in ("torch", "tf-eager"):
            search, native = self._eager(step)
            return search.greedy_search(native, *args)
        table = self._table(step)
        # checked, and Python ints for the loop, as tf_impl.decoding passes them (the loops check
        # nothing: a NumPy int8 max_len ranged in int8 there)
        args = (*D.check_greedy_args(table, *args), bos_id, eos_id, pad_id)
        return tf_search.greedy_result(_compiled_greedy(table.vocab, table.dtype.name, *args)())

    def beam_search(self, step, batch, max_len, beam_size, bos_id, eos_id, pad_id,
                    length_penalty=0.0, return_all=False) -> D.BeamResult:
        args = (batch, max_len, beam_size, bos_id, eos_id, pad_id)
        if self.name == "reference":
            return D.beam_search(step, *args, length_penalty, return_all)
        if self.name in ("torch", "tf-eager"):
            search, native = self._eager(step)
            return search.beam_search(native, *args, length_penalty, return_all)
        table = self._table(step)
        args = (*D.check_beam_args(table, *args, length_penalty), bos_id, eos_id, pad_id)  # as greedy_search's
        loop = _compiled_beam(table.vocab, table.dtype.name, *args)
        return tf_search.beam_result(loop(tf.constant(float(length_penalty), table.dtype)), return_all)

    def markov(self, table: np.ndarray, beam_size: int, alpha: float, ids):
        """The loops on a `MarkovStep` table (beam_size 0: greedy; every beam returned). The
        compiled TF modes run a TF-native step (XLA cannot call NumPy); the others the NumPy one."""
        batch, max_len = table.shape[0], table.shape[1]
        if self.name not in ("tf-function", "tf-xla"):
            step = MarkovStep(table, max(beam_size, 1))
            if beam_size == 0:
                return self.greedy_search(step, batch, max_len, *ids)
            return self.beam_search(step, batch, max_len, beam_size, *ids, alpha, True)
        loop = _markov_loop(beam_size, batch, max_len, tuple(ids), self.name == "tf-xla")
        out = loop(tf.constant(table), tf.constant(alpha, tf.float64))
        return tf_search.greedy_result(out) if beam_size == 0 else tf_search.beam_result(out, True)


class MarkovStep:
    """``table[item, t, last token]`` ``(B, T, V, V)`` as a NumPy step: row n at step t reads
    ``table[n // beams, t, prefixes[n, t]]``, column t alone, as a cached step does."""

    def __init__(self, table: np.ndarray, beams: int):
        self.table, self.beams = table, beams
        self.vocab, self.dtype = table.shape[-1], np.float64

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        item = np.arange(len(prefixes)) // self.beams
        return self.table[item, t, prefixes[:, t]], state

    def reorder(self, state, rows):
        return state


class TFMarkovStep(MarkovStep):
    """`MarkovStep` in TF ops (so that it also runs under XLA)."""

    def __init__(self, table, beams: int):
        self.table, self.beams = table, beams
        self.vocab, self.dtype = int(table.shape[-1]), tf.float64

    def __call__(self, prefixes, t, state):
        n = prefixes.shape[0]
        last = tf.gather(prefixes, t, axis=1)  # (N,)
        at = tf.stack([tf.range(n, dtype=tf.int64) // self.beams, tf.fill([n], tf.cast(t, tf.int64)),
                       last], axis=-1)
        return tf.gather_nd(self.table, at), state


@functools.lru_cache(maxsize=None)
def _markov_loop(beam_size, batch, max_len, ids, jit_compile):
    """One compiled loop per shape; the table and alpha are its arguments (beam_size 0: greedy)."""
    def loop(table, alpha):
        step = TFMarkovStep(table, max(beam_size, 1))
        if beam_size == 0:
            return tf_search.greedy_loop(step, batch, max_len, *ids)
        return tf_search.beam_loop(step, batch, max_len, beam_size, *ids, alpha)
    return tf.function(loop, jit_compile=jit_compile, autograph=False)


def installed_search_backends() -> list[SearchBackend]:
    """The `SEARCH_BACKENDS` whose framework can be imported here (the reference always)."""
    have = {"reference": True, "torch": HAVE_TORCH, "tf": HAVE_TF}
    return [SearchBackend(name) for name in SEARCH_BACKENDS if have[name.partition("-")[0]]]


@pytest.fixture(params=SEARCH_BACKENDS)  # conftest skips a param whose framework is absent
def search_backend(request) -> SearchBackend:
    return SearchBackend(request.param)


# -- the model-level API --------------------------------------------------------------------------
MODEL_BACKENDS = ["torch"] + (["torch-cuda"] if HAVE_TORCH and "cuda" in TORCH_DEVICES else []) + [
    "tf-eager", "tf-function", "tf-xla"]
TF_MODES = {"tf-eager": dict(compiled=False), "tf-function": dict(compiled=True, jit_compile=False),
            "tf-xla": dict(compiled=True, jit_compile=True)}


@functools.lru_cache(maxsize=None)
def _tf_model(config: TransformerConfig):
    return tf_impl.Transformer(config)


class ModelBackend(Backend):
    """One backend's model-level decoding, named as in `MODEL_BACKENDS`: a `Backend` (its
    tensors, NumPy, ``no_grad``, ``inputs``) whose ``build(config, weights)`` gives a model (TF: the
    one model of that config, holding ``weights``) and whose ``greedy_decode`` / ``beam_search``
    take the model-level arguments and add the backend's mode (TF: compiled / jit_compile; torch:
    nothing, the model on the backend's device). ``eager()`` is the backend where ``observe`` works."""

    def __init__(self, name: str):
        framework, _, mode = name.partition("-")
        if framework == "torch":
            super().__init__("torch", "eager", mode or "cpu")
        else:
            super().__init__("tf", mode, "/CPU:0")

    @property
    def name(self) -> str:
        return "torch-cuda" if self.device == "cuda" else self.kind

    def __repr__(self) -> str:
        return self.name

    def eager(self) -> "ModelBackend":
        return ModelBackend("tf-eager") if self.framework == "tf" else self

    def build(self, config: TransformerConfig, weights: dict | None = None, seed: int = 0):
        """`Backend.build` with ``weights`` cast to ``config.dtype`` (the cases hold float64 ones);
        TF's model is the one model of ``config``, given them (its compiled loops kept with it)."""
        weights = (random_weights(config, seed) if weights is None
                   else {name: np.asarray(value).astype(config.dtype) for name, value in weights.items()})
        if self.framework == "torch":
            return super().build(config, weights)
        model = _tf_model(config)
        model.import_weights(weights)
        return model

    def src(self, src: np.ndarray):
        """The sources as this backend's users pass them (torch: a tensor on its device)."""
        return self.tensor(src) if self.framework == "torch" else src

    def greedy_decode(self, model, src, max_len, **kwargs) -> D.GreedyResult:
        return self.impl.greedy_decode(model, src, max_len, **TF_MODES.get(self.name, {}), **kwargs)

    def beam_search(self, model, src, max_len, *args, **kwargs) -> D.BeamResult:
        return self.impl.beam_search(model, src, max_len, *args, **TF_MODES.get(self.name, {}), **kwargs)

    def make_src_mask(self, src, pad_id: int):
        """The backend's own ``inputs.make_src_mask`` of ``src`` (as that backend's tensor)."""
        return self.inputs.make_src_mask(self.tensor(src), pad_id)


@pytest.fixture(params=MODEL_BACKENDS)  # conftest skips a param whose framework is absent
def model_backend(request) -> ModelBackend:
    return ModelBackend(request.param)
