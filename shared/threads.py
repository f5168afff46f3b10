"""The CPU thread and memory policy of the command line and the benchmarks, set before any
framework starts.

* ``OMP_WAIT_POLICY=PASSIVE`` (unless the user set it): an OpenMP thread with nothing to do sleeps
  instead of spinning. torch's CPU kernels run on OpenMP; with spinning workers, a decoding step
  (hundreds of small parallel regions) on cores shared with another process waits for threads the
  other process has preempted: several times slower while another process ran (issue 14;
  docs/performance.md, "Figures behind the code's choices"). The variable is read when OpenMP
  starts, so it is set before torch, TensorFlow or CTranslate2 is imported
  (`apply_thread_policy` is called first thing by ``twins`` and the benchmarks).
* The thread count: ``--threads N`` where given (torch: ``torch.set_num_threads``; TF: its intra-
  and inter-op pools; CTranslate2: ``intra_threads``), else each framework's default (one per
  core). On a loaded machine fewer threads than cores is faster, even with the policy above
  (docs/performance.md, "Figures behind the code's choices").
* Bounds, checked in the process the user started before any framework starts or any worker is
  launched (a usage error naming the flag, the bound and why): ``--threads`` at most the machine's
  logical CPUs (`max_threads`), ``--workers`` at most one per logical CPU and per example of the
  global batch (`max_workers`). Without them ``twins decode --threads 1000000`` crashed after 16 s
  while no other process on the machine could fork, and ``twins train --workers 1000000`` wrote a
  million rendezvous entries (3.9 GB) before any worker could refuse (issue 26).
* ``THP_MEM_ALLOC_ENABLE=1`` (unless the user set it): torch's CPU allocator asks for transparent
  huge pages (``madvise``) for allocations of 2 MB and more. A decoding step streams every weight
  once (about 165 MB for ``base``), and with 4 KB pages the walk through the page tables is a
  large part of that (a gain of a few percent at batch 1, the size of the machine's run-to-run
  noise, less at batch 8: docs/performance.md, "Figures behind the code's choices").
  torch reads it once, at its first allocation.
  Library users who import torch_impl themselves can set it the same way.

Framework-free: environment variables and a count only.
"""
from __future__ import annotations

import argparse
import os

from .checks import int_argument, is_int, refusal
from .messages import shown

WAIT_POLICY = "PASSIVE"
RUNTIME_ENVIRONMENT = {"OMP_WAIT_POLICY": WAIT_POLICY, "THP_MEM_ALLOC_ENABLE": "1"}


def set_runtime_policy() -> None:
    """Set each variable of `RUNTIME_ENVIRONMENT` the user has not set. Call before importing a
    framework: OpenMP and torch's allocator read them once, when they start."""
    for name, value in RUNTIME_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def machine_cpus() -> int:
    """The logical CPUs of the machine (``os.cpu_count``), or this process's affinity mask where
    that is larger (it never is on Linux; the maximum keeps the bound a property of the machine)."""
    return max(os.cpu_count() or 1, available_cores())


def max_threads() -> int:
    """The most ``--threads`` any command accepts: the machine's logical CPUs. Every framework's
    default is already one thread per core; more can only take turns on the cores, and a count in
    the hundreds of thousands exhausts the machine's threads."""
    return machine_cpus()


def max_workers(batch: int) -> int:
    """The most data-parallel ``--workers`` for a global batch of ``batch`` examples: one per
    logical CPU (a worker is a process, or a logical device, with its own framework runtime; more
    only take turns on the cores) and one per example (each worker takes ``batch / N`` rows)."""
    return min(machine_cpus(), batch)


def _count(value, name: str) -> int:
    """A count of threads or workers, an int >= 1 (a NumPy int too, returned as Python's)."""
    if not is_int(value) or value < 1:
        raise refusal(is_int(value))(f"{name}: expected an int >= 1, got {shown(value)}")
    return int(value)


def _too_many_threads(threads: int) -> str:
    return (f"expected at most {max_threads()}, the logical CPUs of this machine (more threads only "
            f"take turns on the cores, and this many would exhaust the machine's threads), "
            f"got {shown(threads, str)}")


def check_threads(threads, name: str = "--threads") -> int | None:
    """``threads`` is None (the frameworks' defaults) or an int in ``[1, max_threads()]``. Checked
    before any framework starts; a TypeError or ValueError naming ``name`` (a usage error, exit 2,
    in ``twins``)."""
    if threads is None:
        return None
    threads = _count(threads, name)
    if threads > max_threads():
        raise ValueError(f"{name} {shown(threads, str)}: {_too_many_threads(threads)}")
    return threads


def thread_count(text: str) -> int:
    """An ``argparse`` type for the benchmarks' ``--threads``: the same bounds as `check_threads`,
    as argparse's usage error (exit 2, ``argument --threads: ...``) before anything starts."""
    threads = int_argument(text, 1)
    if threads > max_threads():
        raise argparse.ArgumentTypeError(_too_many_threads(threads))
    return threads


def check_worker_limit(workers, batch: int, name: str = "--workers") -> int:
    """``workers`` is an int in ``[1, max_workers(batch)]``: checked in the launching process, before
    anything starts (a million workers would otherwise be started, or their rendezvous entries written,
    before any worker could refuse). ``batch``: the global batch the run will use (``--batch``, else
    the resumed run's or the task's). Divisibility is `shared.data_parallel.check_workers`'s, and
    the count alone (any int >= 1, what the backends' ``init_workers`` take) is
    `shared.data_parallel.check_worker_count`'s."""
    workers = _count(workers, name)
    if workers > max_workers(batch):
        shown_workers = shown(workers, str)
        raise ValueError(f"{name} {shown_workers}: expected at most {max_workers(batch)}: one worker per "
                         f"logical CPU of this machine ({machine_cpus()}; each is a process or device "
                         f"with its own framework runtime, more only take turns on the cores) and per "
                         f"example of the global batch ({shown(batch, str)}; each takes batch / N "
                         f"rows), got {shown_workers}")
    return workers


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
