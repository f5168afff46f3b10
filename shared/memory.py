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
    limit = total_memory() if limit is None else limit
    need = memory_floor(tensors, values, itemsize, use)
    if limit is not None and need > limit:
        verb = "to train" if use == "train" else "for inference"
        raise ValueError(f"{what}: {tensors:,} tensors of {values:,} values need at least "
                         f"{need / 2**30:.1f} GiB {verb}, more than this machine's "
                         f"{limit / 2**30:.1f} GiB")
