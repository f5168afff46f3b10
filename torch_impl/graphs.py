"""Cached decoding steps replayed from one CUDA graph: the step at GPU speed.

On a GPU a cached step is a few hundred small kernels (six decoder layers of projections,
attention, layer norms and residual adds, then the generator), each of which takes longer to
launch from Python than to run: the eager step of ``base`` costs about the same at batch 1, 8 and
64 (docs/performance.md). A CUDA graph records those launches once and replays them with one call.

A graph replays fixed kernels on fixed memory, so the step it records must not depend on the
position: `GraphedStep` keeps the token and the position in device tensors that each step
overwrites, and the self-attention writes its key and value with ``index_copy_`` and attends to the
whole preallocated buffer masked to the filled positions (`MultiHeadAttention.extend` with a tensor
position), instead of the eager step's slice of the positions so far, whose shape changes every
step. Masked keys get exactly zero weight, so the graph's logits are the eager step's to rounding
(`parity_tests/test_decoding_torch_only.py` measures it against the eager step and the oracle).

Used by `torch_impl.decoding` for cached decoding on CUDA (``ENABLED``): beam search drives a
`GraphedStep` as any other step (`torch_impl.search`); greedy decoding replays its step and its
selection as one graph (`greedy_loop`), so that a step costs the host one replay and one lagged
read, not the few dozen launches of the loop's bookkeeping. A model keeps its latest graph of each
kind, so a decode of the same shapes as the one before replays it without recording again
(`_kept`; recording costs about three eager steps). Torch-only: TensorFlow compiles its whole
decoding loop with XLA instead (`tf_impl.decoding`).
"""
from __future__ import annotations

import torch

ENABLED = True  # cached decoding on CUDA replays a graph; False: the eager step (tests compare them)


def usable(device: torch.device) -> bool:
    """Whether cached decoding on ``device`` replays a graph (`ENABLED`, and a CUDA device)."""
    return ENABLED and device.type == "cuda"


def _capture(work, device: torch.device):
    """``(graph, output)``: ``work()`` recorded as one CUDA graph, after two warm-up runs on a side
    stream (kernel selection, cuBLAS workspaces), as capture requires; ``output`` is the tensor
    the graph writes at each replay. The warm-up runs change what ``work`` writes."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            work()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = work()
    return graph, output


def _signature(cache, *fixed) -> tuple:
    """What a graph recorded over ``cache`` depends on besides the values in its tensors: every
    cache tensor's shape, dtype and device, the prepared weights it reads (by identity: a graph
    reads them at their addresses, and the model keeps the same objects while its parameters are
    unchanged, `torch_impl.cache._prepared`), whether the source has a row without keys (``src_keep``)
    and whether the cross-attention is folded (`torch_impl.cache.CrossFold`), and ``fixed`` (the
    search's Python constants)."""
    def form(t):
        return None if t is None else (tuple(t.shape), t.dtype, t.device)
    layers = tuple((form(c.self_key), form(c.cross_key), id(c.weights),
                    None if c.cross_fold is None else tuple(map(form, c.cross_fold[:-1])))
                   for c in cache.layers)
    return (layers, form(cache.src_mask), form(cache.src_keep), id(cache.generator), fixed)


def _kept(model, kind: str, fresh, *fixed):
    """The graph of ``kind`` the model kept from an earlier decode, refilled for ``fresh`` (a new
    cache of this decode: its source's cross-attention keys/values, their fold where folded, and
    mask), or None where none fits (`_signature`). A model keeps one graph of each kind, its
    latest: a decode of the same shape then replays it without recording again (the capture
    costs about three eager steps).
    The kept graph's tensors are reused, so one model decodes on CUDA from one thread at a time."""
    kept = model.__dict__.get("_graphs", {}).get(kind)
    if kept is None or kept.signature != _signature(fresh, *fixed):
        model.__dict__.get("_graphs", {}).pop(kind, None)  # its memory freed before a new capture
        return None
    cache = kept.cache
    for old, new in zip(cache.layers, fresh.layers):
        old.cross_key.copy_(new.cross_key)
        old.cross_value.copy_(new.cross_value)
        if old.cross_fold is not None:  # the source folded (`torch_impl.cache.CrossFold`)
            for kept_tensor, fresh_tensor in zip(old.cross_fold[:-1], new.cross_fold[:-1]):
                kept_tensor.copy_(fresh_tensor)
        old.self_keys_values.zero_()  # masked, but a stale inf would still turn 0 * inf into NaN
    cache.src_mask.copy_(fresh.src_mask)
    if cache.src_keep is not None:
        cache.src_keep.copy_(fresh.src_keep)
    cache.length = 0
    return kept


def _keep(model, kind: str, graph) -> None:
    """Keep ``graph`` as the model's graph of ``kind`` (`_kept`), in place of the one before.
    Pickling and copying the model leave it out (`Transformer.__getstate__`)."""
    model.__dict__.setdefault("_graphs", {})[kind] = graph


class _StepGraph:
    """The cached step recorded over ``cache``: reads ``tokens`` ``(N,)`` and ``position`` (0-d),
    writes the cache's key/value buffers and ``logits`` ``(N, V)``, all allocated before the
    capture and never replaced."""

    def __init__(self, model, cache):
        self.cache, self.signature = cache, _signature(cache)
        device = cache.src_mask.device
        self.tokens = torch.zeros(cache.rows, dtype=torch.int64, device=device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        # The warm-up runs write position 0 of the buffers, which the first real step overwrites.
        self.graph, self.logits = _capture(  # logits (N, V)
            lambda: model._step_logits(self.tokens, cache, self.position), device)


class GraphedStep:
    """A cached decoding step (`shared.decoding.Step`, as `torch_impl.decoding.CachedStep`) whose
    work is one CUDA graph, recorded for this decode's rows, source length and capacity, or the
    model's kept one where an earlier decode recorded it for the same (`_kept`).

    Beam search's `reorder` gathers the cache's buffers in place, so the graph keeps reading the
    right rows.
    """

    def __init__(self, model, memory: torch.Tensor, src_mask: torch.Tensor, beams: int, max_len: int):
        fresh = model._init_cache(memory, src_mask, max_len, beams)
        self.recorded = _kept(model, "step", fresh)
        if self.recorded is None:
            self.recorded = _StepGraph(model, fresh)
            _keep(model, "step", self.recorded)
        self.cache = self.recorded.cache
        self.vocab, self.dtype = model.config.tgt_vocab, getattr(torch, model.config.dtype)

    def initial_state(self):
        return self.cache

    def __call__(self, prefixes: torch.Tensor, t: int, cache):
        if t != cache.length:  # the search and the cache must stay in step (a Python int: no sync)
            raise AssertionError(f"GraphedStep: step {t}, cache of {cache.length} positions")
        recorded = self.recorded
        recorded.tokens.copy_(prefixes[:, t])
        recorded.position.fill_(t)
        recorded.graph.replay()
        cache.length += 1
        # a copy (the next replay overwrites the graph's output), widened for the search
        return recorded.logits.to(self.dtype, copy=True), cache

    def reorder(self, cache, rows: torch.Tensor):
        return cache._reorder_beams(rows)  # the search's rows: each within its item


class _GreedyGraph:
    """Greedy's step and selection recorded as one graph over ``cache``: the step
    (`Transformer._step_logits`) and the loop's bookkeeping (`torch_impl.search._greedy_update`,
    the function the eager loop runs) read the position from a device tensor; ``flags`` (a bad
    step output, all finished) is what the host reads."""

    def __init__(self, model, cache, max_len: int, bos_id: int, eos_id: int, pad_id: int):
        from .search import _greedy_update  # the eager loop's own step

        self.cache, self.signature = cache, _signature(cache, max_len, bos_id, eos_id, pad_id)
        self.bos_id, self.pad_id = bos_id, pad_id
        batch, device, dtype = cache.rows, cache.src_mask.device, getattr(torch, model.config.dtype)
        self.prefixes = torch.empty(batch, max_len + 1, dtype=torch.int64, device=device)  # (B, 1+T)
        self.log_probs = torch.empty(batch, max_len, dtype=dtype, device=device)
        self.lengths = torch.empty(batch, dtype=torch.int64, device=device)
        self.finished = torch.empty(batch, dtype=torch.bool, device=device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)

        def step() -> torch.Tensor:
            tokens = self.prefixes.index_select(1, self.position.view(1))[:, 0]  # (B,): column t
            logits = model._step_logits(tokens, cache, self.position).to(dtype)  # half widened
            invalid, _ = _greedy_update(logits, self.prefixes, self.log_probs, self.lengths,
                                        self.finished, self.position, eos_id, pad_id)
            return torch.stack([invalid, self.finished.all()])

        self.reset()
        self.graph, self.flags = _capture(step, device)

    def reset(self) -> None:
        """The loop's start (the warm-up runs and every decode change it)."""
        self.prefixes.fill_(self.pad_id)
        self.prefixes[:, 0] = self.bos_id
        self.log_probs.zero_()
        self.lengths.zero_()
        self.finished.zero_()


def greedy_loop(model, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int, bos_id: int,
                eos_id: int, pad_id: int) -> dict[str, torch.Tensor]:
    """`torch_impl.search.greedy_loop` with a cached step whose step and selection are one CUDA
    graph (`_GreedyGraph`, recorded for this decode's shapes or kept from an earlier decode of the
    same, `_kept`): a step is one position write, one replay and the loop's one (lagged) host
    read. The same tensors out as `search.greedy_loop` (copies: the next decode reuses the graph's);
    no ``observe`` (a hook would run between the kernels the graph fuses)."""
    from .search import _LaggedReads  # the eager loop's own read

    fresh = model._init_cache(memory, src_mask, max_len, 1)
    recorded = _kept(model, "greedy", fresh, max_len, bos_id, eos_id, pad_id)
    if recorded is None:
        recorded = _GreedyGraph(model, fresh, max_len, bos_id, eos_id, pad_id)
        _keep(model, "greedy", recorded)
    recorded.reset()
    reads = _LaggedReads(memory.device)
    for t in range(max_len):
        recorded.position.fill_(t)
        recorded.graph.replay()
        if reads.over(recorded.flags[0], recorded.flags[1], t):
            break
    reads.finish()
    return {"tokens": recorded.prefixes[:, 1:].clone(), "log_probs": recorded.log_probs.clone(),
            "lengths": recorded.lengths.clone()}
