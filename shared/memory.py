"""Whether a model a config describes can be built on this machine at all, decided from the config
alone (NumPy-free arithmetic, nothing of the model's size built).

A checkpoint's config is bounded by its file (`shared.weights.check_fits`); a config that comes
alone (``twins train --config`` for a new run, ``twins compare --config``) is bounded by nothing
but the memory: 10**6 layers ran until the memory limit killed the process. `check_memory`
refuses, naming the option, a config whose *floor* (a cost no backend can go below) is more than
the machine's memory in all. The floor is a floor, not an estimate: a config under it may still
not fit, and then the framework's own allocator error says so.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from .config import TransformerConfig

# What one weight tensor costs beyond its values, in the lightest case measured: torch_impl on the
# CPU, float32, a model of 4,204 tensors of 4-element layers, resident memory after one
# `train_step` (`nn.Parameter`, its gradient, Adam's two moments, autograd's bookkeeping):
# 18-30 KB a tensor. tf_impl costs far more (its traced training step: about 1 MB a tensor).
TENSOR_OVERHEAD = 16 * 1024

# Copies of the values a use holds at once: training keeps the NumPy initialisation, the
# backend's weights, their gradients and Adam's two moments; inference the NumPy weights and the
# backend's.
COPIES = {"train": 5, "inference": 2}

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",                    # cgroup v2
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v1


def total_memory() -> int | None:
    """The bytes this process may use in all: the machine's physical memory, or its cgroup's
    limit where that is lower; None where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" in v2 means no limit
            limits.append(int(text))
    return min(limits) if limits else None


def mapping_use() -> tuple[int, int] | None:
    """``(memory mappings this process holds, vm.max_map_count)``: Linux refuses a process more
    mappings than that, and code a JIT compiles (XLA's executables) holds mappings of its own; None
    where Linux's /proc does not say (another OS: no such limit known)."""
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as f:
            limit = int(f.read())
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            return sum(1 for _ in f), limit
    except (OSError, ValueError):
        return None


def exceeded(need: int, limit: int | None = None) -> int | None:
    """The memory (``limit``, default `total_memory`) where ``need`` bytes are more than it, else
    None (also where the machine's memory cannot be read): the test of every refusal by size in
    shared/ (a model, a training step, a batch of ids, a search's buffers, the demo examples)."""
    limit = total_memory() if limit is None else limit
    return limit if limit is not None and need > limit else None


def memory_floor(tensors: int, values: int, itemsize: int, use: str) -> int:
    """The fewest bytes a model of ``tensors`` tensors holding ``values`` values of ``itemsize``
    bytes needs for ``use`` (a key of `COPIES`)."""
    return tensors * TENSOR_OVERHEAD + values * itemsize * COPIES[use]


def check_memory(tensors: int, values: int, itemsize: int, use: str, what: str,
                 limit: int | None = None) -> None:
    """Refuse a model whose `memory_floor` for ``use`` exceeds ``limit`` (default `total_memory`):
    ``"--config 'big.json': a model of 2,000,000 layers (33,000,002 tensors, ...) needs at least
    504 GiB to train, more than this machine's 23.5 GiB"``. ``what`` names the option and the
    model (the caller's words, ending before the colon)."""
    need = memory_floor(tensors, values, itemsize, use)
    limit = exceeded(need, limit)
    if limit is not None:
        verb = "to train" if use == "train" else "for inference"
        raise ValueError(f"{what}: {tensors:,} tensors of {values:,} values need at least "
                         f"{need / 2**30:.1f} GiB {verb}, more than this machine's "
                         f"{limit / 2**30:.1f} GiB")


def training_floor(config: TransformerConfig, rows: int, src_len: int, tgt_len: int) -> int:
    """The fewest bytes one training step of ``rows`` rows (``src_len`` source and ``tgt_len``
    target positions) holds at once in any backend and precision, when its backward pass begins:
    what the weights' gradients are computed from. Every linear map's gradient needs the map's
    input, so each is kept: per position of each encoder layer, the input of the query/key/value
    maps, of the attention's output map, of the feed-forward network and of its second map
    (``3 * d_model + d_ff``, attention ``n_heads * head_dim`` wide); per position of each decoder
    layer, those of both attentions (``5 * d_model + d_ff``); the encoder's output (the cross
    attentions' keys and values); the output layer's input and the log-probabilities over the
    target vocabulary, with their gradient (``d_model + 2 * tgt_vocab``). Float32 values, float64
    for a float64 model (half precision keeps the residual stream and the log-probabilities in
    float32: `shared.precision`). Attention probabilities, norms' statistics, the weights and
    everything else a backend allocates come on top: a floor, not an estimate."""
    d, d_ff = config.d_model, config.d_ff
    inner = config.n_heads * (config.head_dim or d // config.n_heads)  # attention's width
    encoder = config.n_encoder_layers * (d + 2 * inner + d_ff) + d
    decoder = config.n_decoder_layers * (3 * d + 2 * inner + d_ff) + d + 2 * config.tgt_vocab
    itemsize = 8 if config.dtype == "float64" else 4
    return rows * (src_len * encoder + tgt_len * decoder) * itemsize


def check_training_batch(config: TransformerConfig, rows: int, src_len: int, tgt_len: int, what: str) -> None:
    """Refuse a training batch whose `training_floor` exceeds this machine's memory, before any of
    it is drawn: ``"--batch 3000000: a training step of 3,000,000 rows of 10 source and 11 target
    positions keeps at least 200.1 GiB for its backward pass (...), more than this machine's 23.5
    GiB; give a smaller --batch"``. ``what`` names the option (the caller's words, ending before
    the colon)."""
    need = training_floor(config, rows, src_len, tgt_len)
    limit = exceeded(need)
    if limit is not None:
        raise ValueError(f"{what}: a training step of {rows:,} rows of {src_len} source and {tgt_len} "
                         f"target positions keeps at least {need / 2**30:.1f} GiB for its backward "
                         f"pass (every linear map's input and the log-probabilities' gradient), more "
                         f"than this machine's {limit / 2**30:.1f} GiB; give a smaller --batch")
