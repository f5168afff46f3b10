"""Greedy decoding and beam search with a `torch_impl.Transformer`: the model-level API.

Same signatures, checks and results as `shared.reference.greedy_decode` / `.beam_search` (the
float64 oracle), plus ``use_cache``. The search is `torch_impl.search` (the algorithm of
`shared.decoding`, on tensors); here it is driven by the model through one of two step functions:

* cached (default): the source is encoded once, cross-attention keys/values are computed once per
  source (`Transformer.init_cache`), and each step feeds only the newest token
  (`Transformer.decode_step`), reading and extending the self-attention cache; beam search gathers
  the cache rows by source beam after each selection;
* recompute (``use_cache=False``): each step runs the whole decoder on the prefix, with the
  padding-AND-subsequent target mask, exactly as the oracle does.

Both give the same tokens; their log-probs agree to rounding (the cache test measures it).
Decoding runs on the model's device and dtype, in eval mode (restored afterwards) and without
gradients; with a half precision (`torch_impl.precision.set_precision`) its products run in that
precision and its search in float32 (`shared.precision`). Results are NumPy arrays, as the oracle's, so the three implementations compare directly;
scores are in the model's dtype (float32 by default; the oracle's are float64).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from shared.checks import batch_ids, mask_array
from shared.decoding import GREEDY, BeamResult, GreedyResult, check_flags, check_search_args
from shared.masks import padding_id, start_is_pad

from . import graphs, search
from .cache import _as_built, _mode, repeat_rows
from .inputs import _from_array, check_ids, make_tgt_mask
from .model import Transformer, check_model
from .precision import autocast


@contextmanager
def _inference(model: Transformer):
    """Eval mode (no dropout) and no autograd while decoding; each module's own mode comes back
    after (`torch_impl.cache._mode`).

    ``torch.inference_mode`` rather than ``no_grad``: no version counters or view tracking on the
    tensors a decode makes (its caches, logits and prefixes, none of which outlives it), which a
    step's hundred-odd small ops pay for (a few percent of a step: docs/performance.md, "Figures
    behind the code's choices"). The weights a decode prepares and the model keeps are made outside
    it (`Transformer._step_weights`). In a half precision the whole decode runs under the
    model's autocast (`torch_impl.precision`)."""
    with _mode(model, False), torch.inference_mode(), autocast(model), _attention_kernels(model):
        yield


def _attention_kernels(model: Transformer):
    """On CUDA, SDPA's flash, memory-efficient and math kernels, not cuDNN's: a decode's attention
    changes shape at every step (the cached keys grow by one position, a recomputed prefix too),
    and cuDNN's attention builds an execution plan per shape: a token took over twenty times as
    long with cuDNN's kernel chosen (docs/performance.md, "Figures behind the code's choices")."""
    if model._device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _tensor(name: str, value, device: torch.device) -> torch.Tensor:
    """``value`` on ``device``: NumPy arrays and nested lists are accepted like tensors, as tf_impl
    and the reference take them (results are NumPy whatever the input); anything else is named
    in their words (`shared.checks.batch_ids`)."""
    if not isinstance(value, torch.Tensor):
        value = _from_array(batch_ids(name, value))
    return value.to(device)


def _mask(value, device: torch.device) -> torch.Tensor:
    """A mask given to a decoder on ``device``: a tensor, or a NumPy bool array converted, as
    tf_impl and the reference take them; anything else is refused in their words
    (`shared.checks.mask_array`: nested lists too, which the others refuse)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return _from_array(mask_array("src_mask", value)).to(device)


def _decode_inputs(model, src, max_len, src_mask, beam_size=GREEDY, length_penalty=0.0, **flags):
    """Checks in the order `shared.decoding` fixes: model, src, search arguments, flags, then the
    mask."""
    check_model(model)
    c, device = model.config, model._device
    src = _tensor("src", src, device)
    check_ids("src", src, c.src_vocab, c.max_len)
    check_search_args(c, max_len, beam_size, length_penalty)
    check_flags(**flags)
    return src, model._src_mask(src, None if src_mask is None else _mask(src_mask, device))


class RecomputeStep:
    """Each step runs the whole decoder on the prefix: ``prefixes[:, :t+1] -> logits (N, V)``
    (a `shared.decoding.Step` without state: the prefixes carry it all)."""

    def __init__(self, model: Transformer, memory: torch.Tensor, src_mask: torch.Tensor, beams: int,
                 max_len: int):
        self.model, self.max_len = model, max_len  # unused here; TF's XLA path needs it
        self.memory = repeat_rows(memory, beams)  # (N, S, d), row item * beams + beam
        self.src_mask = repeat_rows(src_mask, beams)  # (N|1, 1|H, 1, S)
        self.vocab, self.dtype = model.config.tgt_vocab, getattr(torch, model.config.dtype)

    def initial_state(self):
        return ()  # the prefixes carry all the state

    def __call__(self, prefixes: torch.Tensor, t: int, state):
        m = self.model
        tgt = prefixes[:, : t + 1]  # (N, t+1)
        tgt_mask = make_tgt_mask(tgt, padding_id(m.config), start_is_pad(m.config))  # (N, 1, t+1, t+1)
        hidden = m._decode(tgt, self.memory, self.src_mask, tgt_mask, None)  # (N, t+1, d)
        # (N, V) logits in the model's dtype: a half precision's are widened for the search
        return m.generator(hidden[:, -1]).to(self.dtype), state

    def reorder(self, state, rows: torch.Tensor):
        return state


class CachedStep:
    """Each step feeds the newest token (column ``t``) and the key/value cache -> logits (N, V)
    (a `shared.decoding.Step` whose state is the `DecoderCache`)."""

    def __init__(self, model: Transformer, memory: torch.Tensor, src_mask: torch.Tensor, beams: int,
                 max_len: int):
        self.model = model
        self.cache = model._init_cache(memory, src_mask, max_len, beams)
        self.vocab, self.dtype = model.config.tgt_vocab, getattr(torch, model.config.dtype)

    def initial_state(self):
        return self.cache

    def __call__(self, prefixes: torch.Tensor, t: int, cache):
        if t != cache.length:  # the search and the cache must stay in step (a Python int: no sync)
            raise AssertionError(f"CachedStep: step {t}, cache of {cache.length} positions")
        logits, cache = self.model._decode_step(prefixes[:, t], cache)  # (N, V)
        if logits.dtype != self.dtype:  # a half precision's widened for the search
            logits = logits.to(self.dtype)
        return logits, cache

    def reorder(self, cache, rows: torch.Tensor):
        return cache._reorder_beams(rows)  # the search's rows: each within its item


def _step(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor, beams: int, max_len: int,
          use_cache: bool):
    memory = model._encode_for_decoding(src, src_mask)  # (B, S, d), once per source
    if not use_cache:
        kind = RecomputeStep
    else:  # on CUDA the step's launches are replayed from one graph (torch_impl.graphs)
        kind = graphs.GraphedStep if _graphed(model, src.device) else CachedStep
    return kind(model, memory, src_mask, beams, max_len)


def _graphed(model: Transformer, device: torch.device) -> bool:
    """Whether a cached decode replays CUDA graphs: on CUDA (`torch_impl.graphs.usable`), for a
    model as built (`torch_impl.cache._as_built`). A graph replays kernels; it would not call a
    replaced module's Python, nor fire a hook, at each step."""
    return graphs.usable(device) and _as_built(model)


def greedy_decode(model: Transformer, src, max_len: int, src_mask=None, use_cache: bool = True,
                  observe: search.Observe | None = None) -> GreedyResult:
    """Greedy decoding (algorithm: `shared.decoding`); mirrors `shared.reference.greedy_decode`.

    Args:
        model: a `torch_impl.Transformer`; the start (``config.start_id``), EOS and PAD ids come
            from its config.
        src: source ids ``(B, S)``, an integer tensor (or NumPy array, or nested list), padding allowed (an
            all-padding row decodes too, from the decoder alone).
        max_len: new tokens to generate at most, EOS included (1 <= max_len <= config.max_len).
        src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; default ``src != pad_id``.
        use_cache: decode incrementally with the key/value cache (default) or recompute the whole
            decoder on the prefix at every step.
        observe: diagnostics hook, see `torch_impl.search`.

    Shape:
        tokens ``(B, max_len)`` int64 without BOS, pad after EOS; log_probs ``(B, max_len)`` in the
        model's dtype, 0 after EOS; lengths ``(B,)`` generated tokens including EOS. NumPy arrays.
    """
    src, src_mask = _decode_inputs(model, src, max_len, src_mask, use_cache=use_cache)
    max_len = int(max_len)  # a NumPy int checked as an int: a Python one for the loop (as tf_impl)
    c = model.config
    with _inference(model):
        if use_cache and observe is None and _graphed(model, src.device):  # step and selection: one graph
            memory = model._encode_for_decoding(src, src_mask)
            return search.greedy_result(graphs.greedy_loop(model, memory, src_mask, max_len, c.start_id,
                                                           c.eos_id, c.pad_id))
        step = _step(model, src, src_mask, 1, max_len, use_cache)
        return search.greedy_search(step, src.shape[0], max_len, c.start_id, c.eos_id, c.pad_id,
                                    observe, device=model._device)


def beam_search(model: Transformer, src, max_len: int, beam_size: int = 4, length_penalty: float = 0.0,
                return_all: bool = False, src_mask=None, use_cache: bool = True,
                observe: search.Observe | None = None) -> BeamResult:
    """Beam search (algorithm: `shared.decoding`); mirrors `shared.reference.beam_search`.

    Args:
        model, src, max_len, src_mask, use_cache, observe: as `greedy_decode`.
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
                                   return_all=return_all, use_cache=use_cache)
    # NumPy ints as Python ints (as tf_impl): an int8 beam_size of 17 wrapped its beams' products
    max_len, beam_size = int(max_len), int(beam_size)
    c = model.config
    with _inference(model):
        step = _step(model, src, src_mask, beam_size, max_len, use_cache)
        return search.beam_search(step, src.shape[0], max_len, beam_size, c.start_id, c.eos_id,
                                  c.pad_id, length_penalty, return_all, observe, device=model._device)
