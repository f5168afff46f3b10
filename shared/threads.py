"""The CPU thread policy of the command line and the benchmarks, set before any framework starts.

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

Framework-free: environment variables and a count only.
"""
from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"


def check_threads(threads, name: str = "--threads") -> int | None:
    """``threads`` is None (the frameworks' defaults) or an int >= 1."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {threads!r}")
    return threads


def apply_thread_policy(threads: int | None = None) -> int | None:
    """Set ``OMP_WAIT_POLICY`` (unless already set) and check ``threads``; returns it. Call before
    importing a framework: OpenMP reads the variable once, when it starts."""
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    return check_threads(threads)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
