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
read, not the few dozen launches of the loop's bookkeeping. Torch-only: TensorFlow compiles its whole
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


class GraphedStep:
    """A cached decoding step (`shared.decoding.Step`, as `torch_impl.decoding.CachedStep`) whose
    work is one CUDA graph, captured for this decode's rows, source length and capacity.

    The graph reads ``tokens`` ``(N,)`` and ``position`` (0-d) and writes the cache's key/value
    buffers and ``logits`` ``(N, V)``, all allocated before the capture and never replaced; beam
    search's `reorder` gathers the buffers in place, so the graph keeps reading the right rows.
    """

    def __init__(self, model, memory: torch.Tensor, src_mask: torch.Tensor, beams: int, max_len: int):
        self.model = model
        self.cache = model._init_cache(memory, src_mask, max_len, beams)
        self.vocab, self.dtype = model.config.tgt_vocab, getattr(torch, model.config.dtype)
        device = memory.device
        self.tokens = torch.zeros(self.cache.rows, dtype=torch.int64, device=device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        # The warm-up runs write position 0 of the buffers, which the first real step overwrites.
        self.graph, self.logits = _capture(  # logits (N, V)
            lambda: model._step_logits(self.tokens, self.cache, self.position), device)

    def initial_state(self):
        return self.cache

    def __call__(self, prefixes: torch.Tensor, t: int, cache):
        if t != cache.length:  # the search and the cache must stay in step (a Python int: no sync)
            raise AssertionError(f"GraphedStep: step {t}, cache of {cache.length} positions")
        self.tokens.copy_(prefixes[:, t])
        self.position.fill_(t)
        self.graph.replay()
        cache.length += 1
        # a copy (the next replay overwrites the graph's output), widened for the search
        return self.logits.to(self.dtype, copy=True), cache

    def reorder(self, cache, rows: torch.Tensor):
        return cache.reorder_beams(rows)


def greedy_loop(model, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int, bos_id: int,
                eos_id: int, pad_id: int) -> dict[str, torch.Tensor]:
    """`torch_impl.search.greedy_loop` with a cached step whose step and selection are one CUDA
    graph: the step (`GraphedStep`'s work) and the loop's bookkeeping
    (`torch_impl.search._greedy_update`, the same function the eager loop runs) read the position
    from a device tensor, so a step is one position write, one replay and the loop's one
    (lagged) host read. The same tensors out as `search.greedy_loop`; no ``observe`` (a hook
    would run between the kernels the graph fuses)."""
    from .search import _LaggedReads, _greedy_update  # the eager loop's own step and read

    cache = model._init_cache(memory, src_mask, max_len, 1)
    batch, device, dtype = cache.rows, memory.device, getattr(torch, model.config.dtype)
    prefixes = torch.empty(batch, max_len + 1, dtype=torch.int64, device=device)  # (B, 1+T)
    log_probs = torch.empty(batch, max_len, dtype=dtype, device=device)
    lengths = torch.empty(batch, dtype=torch.int64, device=device)
    finished = torch.empty(batch, dtype=torch.bool, device=device)
    position = torch.zeros((), dtype=torch.int64, device=device)

    def reset() -> None:  # the loop's start (the warm-up runs below change it)
        prefixes.fill_(pad_id)
        prefixes[:, 0] = bos_id
        log_probs.zero_()
        lengths.zero_()
        finished.zero_()

    def step() -> torch.Tensor:
        tokens = prefixes.index_select(1, position.view(1))[:, 0]  # (B,): column t
        logits = model._step_logits(tokens, cache, position).to(dtype)  # half widened for the search
        invalid, _ = _greedy_update(logits, prefixes, log_probs, lengths, finished, position,
                                   eos_id, pad_id)
        return torch.stack([invalid, finished.all()])  # what the host reads

    reset()
    graph, flags = _capture(step, device)
    reset()
    reads = _LaggedReads(device)
    for t in range(max_len):
        position.fill_(t)
        graph.replay()
        if reads.over(flags[0], flags[1], t):
            break
    reads.finish()
    return {"tokens": prefixes[:, 1:], "log_probs": log_probs, "lengths": lengths}
