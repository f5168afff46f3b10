"""The CPU thread and memory policy of the command line and the benchmarks, set before any
framework starts.

* ``OMP_WAIT_POLICY=PASSIVE`` (unless the user set it): an OpenMP thread with nothing to do sleeps
  instead of spinning. torch's CPU kernels run on OpenMP; with spinning workers, a decoding step
  (hundreds of small parallel regions) on cores shared with another process waits for threads the
  other process has preempted. Measured in issue 14 on this 2-core machine: torch_impl with its
  default 2 threads was 6 to 16 times slower than with 1 thread while another process ran.
  The variable is read when OpenMP starts, so it is set before torch, TensorFlow or CTranslate2
  is imported (`apply_thread_policy` is called first thing by ``twins`` and the benchmarks).
* The thread count: ``--threads N`` where given (torch: ``torch.set_num_threads``; TF: its intra-
  and inter-op pools; CTranslate2: ``intra_threads``), else each framework's default (one per
  core). On a loaded machine fewer threads than cores is faster: measured with the policy above
  (base, greedy, batch 1, 2 cores at a load average of 5 to 7), 1 thread took 24-28 ms a step and 2
  threads 30-35 ms.
* ``THP_MEM_ALLOC_ENABLE=1`` (unless the user set it): torch's CPU allocator asks for transparent
  huge pages (``madvise``) for allocations of 2 MB and more. A decoding step streams every weight
  once (about 165 MB for ``base``), and with 4 KB pages the walk through the page tables is a
  large part of that: measured (base, greedy, 64 tokens, batch 1, 1 thread, quiet 2-core AMD EPYC,
  the kernel's THP mode ``madvise``, interleaved pairs of runs, 3 decodes each) 11.9-12.7 ms a step
  with the variable against 13.5-15.8 without in two pairs, 11.6-13.5 against 12.1-13.3 in three
  later ones (a gain of 4 to 12%, the size of this machine's run-to-run noise); at batch 8
  23.3-25.1 against 24.2-25.6 (products there are bound by arithmetic more than by memory).
  torch reads it once, at its first allocation.
  Library users who import torch_impl themselves can set it the same way.

Framework-free: environment variables and a count only.
"""
from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"
RUNTIME_ENVIRONMENT = {"OMP_WAIT_POLICY": WAIT_POLICY, "THP_MEM_ALLOC_ENABLE": "1"}


def set_runtime_policy() -> None:
    """Set each variable of `RUNTIME_ENVIRONMENT` the user has not set. Call before importing a
    framework: OpenMP and torch's allocator read them once, when they start."""
    for name, value in RUNTIME_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def check_threads(threads, name: str = "--threads") -> int | None:
    """``threads`` is None (the frameworks' defaults) or an int >= 1."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {threads!r}")
    return threads


def apply_thread_policy(threads: int | None = None) -> int | None:
    """`set_runtime_policy`, and check ``threads``; returns it. Call before importing a framework."""
    set_runtime_policy()
    return check_threads(threads)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
