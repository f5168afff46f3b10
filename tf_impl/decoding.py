"""Greedy decoding and beam search with a `tf_impl.Transformer`: the model-level API.

Same signatures, checks and results as `shared.reference.greedy_decode` / `.beam_search` (the
float64 oracle) and torch_impl's, plus ``use_cache`` and ``compiled`` / ``jit_compile``. The search
is `tf_impl.search` (the algorithm of `shared.decoding`, one ``tf.while_loop``); here it is driven
by the model through one of two steps:

* cached (default): the source is encoded once, cross-attention keys/values are computed once per
  source (`Transformer.init_cache`), and each step feeds only the newest token
  (`Transformer.decode_step`), reading and extending the fixed-shape self-attention cache; beam
  search gathers the cache rows by source beam after each selection;
* recompute (``use_cache=False``): each step runs the whole decoder on the prefix, with the
  padding-AND-subsequent target mask, exactly as the oracle does. Under XLA, whose shapes are
  static, it runs on all ``max_len`` positions and reads position ``t`` (the causal mask hides the
  rest), so every step costs as much as the last.

Compiled (default): encoding, cache initialisation, the ``tf.while_loop`` over the steps and the
beam reordering (``tf.gather``) run as one ``tf.function`` per model, with XLA for the cached path
(`JIT_COMPILE`, measured), traced per ``max_len``, beam size and mode and reused afterwards
(alpha is a tensor argument: one trace serves every length penalty; one trace of unknown batch and
length serves every source, from the first, as a SavedModel's does). XLA still compiles each new
source shape
anew and keeps the executable (seconds for ``base``: docs/performance.md, "Retracing"): pad
sources to a few fixed lengths when decoding many batches of varied lengths. Source ids are checked
eagerly before any of it (an XLA program cannot raise). `greedy_decode_tensors` /
`beam_search_tensors` call the same compiled program on tensors from inside another
``tf.function`` (a SavedModel signature, `tf_impl.saved_model`), the checks being the caller's.

``compiled=False`` runs the very same function eagerly, op by op: identical tokens and lengths,
scores equal to rounding, not bit for bit (inside a tf.function TF's graph optimizer turns the
divisions by constants of the layer norm and the length penalty into multiplications by rounded
reciprocals, as it does for the model's forward pass; XLA has its own kernels).

Results are NumPy arrays, as the oracle's, so the three implementations compare directly; scores
are in the model's dtype (float32 by default; the oracle's are float64).
"""
from __future__ import annotations

import weakref

import tensorflow as tf

from shared.decoding import GREEDY, BeamResult, GreedyResult, check_flags, check_search_args
from shared.masks import padding_id, start_is_pad
from shared.memory import mapping_use as _mapping_use

from . import search
from .cache import repeat_rows
from .inputs import check_ids, dims, in_xla_context, make_src_mask, make_tgt_mask
from .model import Transformer, _traced, check_model

# use_cache -> the default jit_compile: XLA where it helps (docs/performance.md, "Figures behind
# the code's choices"). Cached: XLA fuses the many small per-step ops, and its dot is several times
# faster than TF's MatMul for the tied generator projection. Recompute: static shapes would make
# every XLA step run all max_len positions, where tf.function runs the t + 1 of the prefix.
JIT_COMPILE = {True: True, False: False}


class RecomputeStep:
    """Each step runs the whole decoder on the prefix: ``prefixes[:, :t+1] -> logits (N, V)``."""

    def __init__(self, model: Transformer, memory: tf.Tensor, src_mask: tf.Tensor, beams: int,
                 max_len: int):
        self.model, self.max_len = model, max_len
        self.memory = repeat_rows(memory, beams)  # (N, S, d), row item * beams + beam
        self.src_mask = repeat_rows(src_mask, beams)  # (N|1, 1|H, 1, S)
        self.vocab, self.dtype = model.config.tgt_vocab, tf.as_dtype(model.config.dtype)

    def initial_state(self):
        return ()  # the prefixes carry all the state

    def __call__(self, prefixes: tf.Tensor, t: tf.Tensor, state):
        m = self.model
        # XLA needs static shapes: all max_len positions, of which position t is read.
        tgt = prefixes[:, : self.max_len] if in_xla_context() else prefixes[:, : t + 1]  # (N, t+1|T)
        tgt_mask = make_tgt_mask(tgt, padding_id(m.config), start_is_pad(m.config))  # (N, 1, L, L)
        hidden = m._decode(tgt, self.memory, self.src_mask, tgt_mask, None, False)  # (N, L, d)
        logits = m.generator(tf.gather(hidden, [t], axis=1))[:, 0]  # (N, V)
        return tf.cast(logits, self.dtype), state  # a half precision's widened for the search

    def reorder(self, state, rows: tf.Tensor):
        return state


class CachedStep:
    """Each step feeds the newest token (column ``t``) and the key/value cache -> logits (N, V)."""

    def __init__(self, model: Transformer, memory: tf.Tensor, src_mask: tf.Tensor, beams: int,
                 max_len: int):
        self.model = model
        self.cache = model._init_cache(memory, src_mask, max_len, beams)
        self.vocab, self.dtype = model.config.tgt_vocab, tf.as_dtype(model.config.dtype)

    def initial_state(self):
        return self.cache

    def __call__(self, prefixes: tf.Tensor, t: tf.Tensor, cache):
        # The search and the cache stay in step: cache.length == t, the position this token fills.
        logits, cache = self.model._decode_step(tf.gather(prefixes, t, axis=1), cache)  # (N, V)
        return tf.cast(logits, self.dtype), cache  # a half precision's widened for the search

    def reorder(self, cache, rows: tf.Tensor):
        return cache._reorder_beams(rows)  # the search's rows: each within its item


def _step(model: Transformer, src: tf.Tensor, src_mask: tf.Tensor, beams: int, max_len: int,
          use_cache: bool):
    memory = model._encode(src, src_mask, None, False)  # (B, S, d), once per source
    kind = CachedStep if use_cache else RecomputeStep
    return kind(model, memory, src_mask, beams, max_len)


# -- the programs: what compiled=True puts in one tf.function -------------------------------------
def _greedy_program(model, src, src_mask, max_len, use_cache, observe=None):
    c = model.config
    step = _step(model, src, src_mask, 1, max_len, use_cache)
    return search.greedy_loop(step, dims(src, 1)[0], max_len, c.start_id, c.eos_id, c.pad_id, observe)


def _beam_program(model, src, src_mask, alpha, max_len, beam_size, use_cache, observe=None):
    c = model.config
    step = _step(model, src, src_mask, beam_size, max_len, use_cache)
    return search.beam_loop(step, dims(src, 1)[0], max_len, beam_size, c.start_id, c.eos_id, c.pad_id,
                            alpha, observe)


# model -> {(program, jit_compile): (structure, tf.function)}; weak, so a model's compiled loops
# go with it.
_COMPILED: "weakref.WeakKeyDictionary[Transformer, dict]" = weakref.WeakKeyDictionary()


def _compiled(model: Transformer, program, jit_compile: bool):
    """The model's ``tf.function`` of ``program``, created once and again whenever the model's
    structure changes (`tf_impl.model._structure`: LoRA, quantization, precision). It traces once
    for each new Python argument (max_len, beam size, use_cache), for unknown batch and length
    (`_trace_for`); XLA still compiles each shape."""
    def make():
        ref = weakref.ref(model)  # the function must not keep its model (the dict's key) alive

        def run(*args, **kwargs):
            return program(ref(), *args, **kwargs)

        # Traced for unknown sizes (`_trace_for`; the loop is written for None sizes, as a
        # SavedModel's signatures trace it), where every new shape kept a trace of its own:
        # docs/performance.md, "Retracing"; reduce_retracing for a call inside another tf.function
        return tf.function(run, jit_compile=jit_compile, autograph=False, reduce_retracing=True)

    return _traced(_COMPILED.setdefault(model, {}), (program.__name__, jit_compile), model, make)


def _trace_specs(args) -> tuple:
    """The argument types a decode is traced for: each tensor's first and last sizes (the batch,
    the source's length) unknown, the sizes between (a mask's heads and query axes) as they are:
    what a SavedModel's signature traces for. Python arguments as they are."""
    def spec(a):
        if not isinstance(a, tf.Tensor):
            return a
        shape = a.shape.as_list()
        return tf.TensorSpec([None, *shape[1:-1], None] if len(shape) >= 2 else [None] * len(shape), a.dtype)
    return tuple(spec(a) for a in args)


# function -> the argument types and Python arguments it has traced for (`_trace_for`)
_TRACED: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()


def _trace_for(function, specs: tuple, kwargs) -> None:
    """Trace ``function`` (one of `_compiled`) for ``specs`` (`_trace_specs`) and ``kwargs`` unless
    it has: the call that follows runs that trace, its only one that takes the call's arguments.

    Why: a trace's sizes shape its graph (one row known to be one keeps the generator as
    ``(d, V)``, `Transformer._step_weights`), and so the last bits of the scores. Left to
    ``reduce_retracing``, the first source shapes each got a trace of their own sizes and later ones
    one of unknown sizes, so one source decoded by one model gave other scores (and, at a near tie,
    other tokens) depending on what that model had decoded before. Now every source runs the trace
    of unknown sizes, as a SavedModel's signature does: the same bits from either."""
    key = (tuple(str(spec) for spec in specs), tuple(sorted(kwargs.items())))
    traced = _TRACED.setdefault(function, set())
    if key not in traced:
        function.get_concrete_function(*specs, **kwargs)
        traced.add(key)


# XLA's executables are never released: TensorFlow keeps each for the process's life, after its
# model and function are collected, and each holds its own memory mappings (about 200-270 for the
# tiny preset, 370-430 for base). Linux refuses a process more than vm.max_map_count mappings, and
# LLVM then aborts it (no exception): after some 240 compiled shapes of tiny, or 320 models
# (docs/performance.md, "Retracing"). So before a decode that may compile (a signature new to its
# function) the mappings left are counted, and a compile that may not fit is refused by name.
_MAPPINGS_HEADROOM = 4096  # about ten compiles of base
_SIGNATURES: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()  # function -> seen


def _check_compile_fits(function, signature) -> None:
    """Refuse, with a MemoryError naming the cause and the way round, an XLA decode of a signature
    ``function`` has not run (so XLA may compile it) when fewer than `_MAPPINGS_HEADROOM` memory
    mappings are left: the compile could let LLVM abort the process."""
    seen = _SIGNATURES.setdefault(function, set())
    if signature in seen:
        return
    use = _mapping_use()
    if use is not None and use[1] - use[0] < _MAPPINGS_HEADROOM:
        raise MemoryError(
            f"tf_impl decoding: this process holds {use[0]:,} memory mappings of the {use[1]:,} the system "
            f"allows (vm.max_map_count), and XLA would compile another decode (shapes "
            f"{signature[1:]}): TensorFlow never releases a compiled decode, even with its model, and "
            "past the limit LLVM aborts the process. Decode sources padded to a few fixed shapes with "
            "models you keep, or pass jit_compile=False (docs/usage.md, \"Using the backends\")")
    seen.add(signature)


def _run(model, program, compiled, jit_compile, use_cache, observe, *args, **kwargs):
    if jit_compile is None:
        jit_compile = JIT_COMPILE[bool(use_cache)] if compiled else False
    if observe is not None and compiled:
        raise ValueError("observe: a Python hook called once a step, so only with compiled=False")
    if jit_compile and not compiled:
        raise ValueError("jit_compile: XLA compiles the tf.function of the loop, so it needs "
                         "compiled=True")
    if not compiled:
        return program(model, *args, use_cache=use_cache, observe=observe, **kwargs)
    kwargs = dict(kwargs, use_cache=bool(use_cache))
    function = _compiled(model, program, bool(jit_compile))
    if not tf.executing_eagerly():  # inside another tf.function, whose trace (and XLA) takes this in
        return function(*args, **kwargs)
    if jit_compile:
        shapes = tuple(tuple(a.shape) if hasattr(a, "shape") else a for a in args)
        _check_compile_fits(function, (program.__name__, *shapes, *sorted(kwargs.items())))
    _trace_for(function, _trace_specs(args), kwargs)
    return function(*args, **kwargs)


def _decode_inputs(model, src, max_len, src_mask, beam_size=GREEDY, length_penalty=0.0, **flags):
    """Checks in the order `shared.decoding` fixes: model, src, search arguments, flags, then the
    mask; all eagerly, before anything is compiled or run."""
    check_model(model)
    if not tf.executing_eagerly():
        raise RuntimeError("greedy_decode/beam_search: call them eagerly (they return NumPy arrays "
                           "and compile their own loop), not inside a tf.function")
    c = model.config
    src = check_ids("src", src, c.src_vocab, c.max_len)  # eagerly: ids read back and range-checked
    check_search_args(c, max_len, beam_size, length_penalty)
    check_flags(**flags)
    return tf.cast(src, tf.int64), model._src_mask(src, src_mask)


def greedy_decode(model: Transformer, src, max_len: int, src_mask=None, use_cache: bool = True,
                  observe: search.Observe | None = None, *, compiled: bool = True,
                  jit_compile: bool | None = None) -> GreedyResult:
    """Greedy decoding (algorithm: `shared.decoding`); mirrors `shared.reference.greedy_decode`.

    Args:
        model: a `tf_impl.Transformer`; the start (``config.start_id``), EOS and PAD ids come
            from its config.
        src: source ids ``(B, S)``, an integer tensor or array, padding allowed (an all-padding row
            decodes too, from the decoder alone).
        max_len: new tokens to generate at most, EOS included (1 <= max_len <= config.max_len).
        src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; default ``src != pad_id``.
        use_cache: decode incrementally with the key/value cache (default) or recompute the whole
            decoder on the prefix at every step.
        compiled: run encoder and loop as one ``tf.function`` (default), else eagerly; same results.
        jit_compile: compile that function with XLA; ``None`` = the measured default `JIT_COMPILE`.
        observe: diagnostics hook (eager only), see `tf_impl.search`.

    Shape:
        tokens ``(B, max_len)`` int64 without BOS, pad after EOS; log_probs ``(B, max_len)`` in the
        model's dtype, 0 after EOS; lengths ``(B,)`` generated tokens including EOS. NumPy arrays.
    """
    src, src_mask = _decode_inputs(model, src, max_len, src_mask, use_cache=use_cache, compiled=compiled,
                                   jit_compile=jit_compile)
    outputs = _run(model, _greedy_program, compiled, jit_compile, use_cache, observe, src, src_mask,
                   max_len=int(max_len))  # a NumPy int checked as an int: a Python one for the loop
    return search.greedy_result(outputs)


def beam_search(model: Transformer, src, max_len: int, beam_size: int = 4, length_penalty: float = 0.0,
                return_all: bool = False, src_mask=None, use_cache: bool = True,
                observe: search.Observe | None = None, *, compiled: bool = True,
                jit_compile: bool | None = None) -> BeamResult:
    """Beam search (algorithm: `shared.decoding`); mirrors `shared.reference.beam_search`.

    Args:
        model, src, max_len, src_mask, use_cache, compiled, jit_compile, observe: as `greedy_decode`.
        beam_size: hypotheses kept per item, 1 <= beam_size <= tgt_vocab - 1 (pad is never generated).
        length_penalty: GNMT alpha >= 0; finished hypotheses score ``raw / ((5 + len) / 6) ** alpha``.
        return_all: also return the K best hypotheses (K alive and K finished are kept), best first.

    Shape:
        tokens ``(B, max_len)``, scores ``(B,)`` ranking scores, step_scores ``(B, max_len)``
        per-token log-probs (0 after EOS), lengths ``(B,)``; with return_all all_tokens
        ``(B, K, max_len)``, all_scores ``(B, K)``, all_lengths ``(B, K)``. NumPy arrays, scores in
        the model's dtype.
    """
    src, src_mask = _decode_inputs(model, src, max_len, src_mask, beam_size, length_penalty,
                                   return_all=return_all, use_cache=use_cache, compiled=compiled,
                                   jit_compile=jit_compile)
    alpha = tf.constant(float(length_penalty), model.config.dtype)
    outputs = _run(model, _beam_program, compiled, jit_compile, use_cache, observe, src, src_mask,
                   alpha, max_len=int(max_len), beam_size=int(beam_size))  # NumPy ints as Python ints
    return search.beam_result(outputs, return_all)


# -- the same programs on tensors, inside a tf.function of the caller's (tf_impl.saved_model) -----
def greedy_decode_tensors(model: Transformer, src: tf.Tensor, max_len: int, use_cache: bool = True,
                          jit_compile: bool | None = None) -> dict[str, tf.Tensor]:
    """What `greedy_decode` computes (its compiled program, the very same ``tf.function``), on
    tensors and callable while tracing another ``tf.function``: a SavedModel signature is traced
    once with ``None`` sizes, so it cannot run the eager checks and NumPy conversion around it.

    The model is checked; nothing else is: ``src`` must be ids the caller has checked, int64
    ``(B, S)`` with every id in ``[0, src_vocab)`` and ``1 <= S <= config.max_len`` (``B`` and
    ``S`` may be unknown at trace time), ``max_len`` checked with
    `shared.decoding.check_search_args`. The mask is ``src != pad_id``
    (all True with ``mask_padding=False``, `shared.masks.padding_id`).

    Returns tensors: tokens ``(B, max_len)`` int64, log_probs ``(B, max_len)``, lengths ``(B,)``
    int64, and bad_step int32 ``()``: ``-1``, or the first step whose logits held NaN or +inf (or
    nothing but pad above -inf) in a live row (under XLA an id out of range embeds as NaN rather
    than raising), where the loop stopped: every row's outputs are then incomplete (`greedy_decode`
    raises instead).
    """
    check_model(model)
    src_mask = make_src_mask(src, padding_id(model.config))  # all True without mask_padding
    return _run(model, _greedy_program, True, jit_compile, use_cache, None, src, src_mask,
                max_len=max_len)


def beam_search_tensors(model: Transformer, src: tf.Tensor, max_len: int, beam_size: int = 4,
                        length_penalty: float = 0.0, use_cache: bool = True,
                        jit_compile: bool | None = None) -> dict[str, tf.Tensor]:
    """What `beam_search` computes, as `greedy_decode_tensors` is to `greedy_decode` (same
    preconditions, the model alone checked). Returns the loop's tensors: every `shared.decoding.BeamResult` field
    (tokens ``(B, max_len)`` int64, scores ``(B,)``, lengths ``(B,)`` int64, ...) and bad_step."""
    check_model(model)
    src_mask = make_src_mask(src, padding_id(model.config))  # all True without mask_padding
    alpha = tf.constant(float(length_penalty), model.config.dtype)
    return _run(model, _beam_program, True, jit_compile, use_cache, None, src, src_mask, alpha,
                max_len=max_len, beam_size=beam_size)
