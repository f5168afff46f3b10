"""Data-parallel training, the framework-free half (NumPy only): which rows of a global batch each
worker takes, the token count every worker divides its loss by, and the digest workers compare
before they train. The engines are each framework's own (`torch_impl.distributed`: DDP over gloo,
launched by torchrun; `tf_impl.distributed`: ``tf.distribute.MirroredStrategy``).

Why an N-worker step equals the one-process step on the whole batch. The training loss is the mean
over the batch's non-padding targets (docs/design.md, convention 14): ``sum_i loss_i / n`` for the
``n`` real targets of the global batch. Worker ``r`` holds rows ``[r*b, (r+1)*b)`` (``b = B / N``);
it computes ``sum over its rows / n`` with the *global* ``n`` (`target_tokens` of the whole batch,
which every worker knows: each draws the same global batch from the same deterministic stream), and
the engine **sums** the workers' gradients. The sum of the workers' losses is the global loss; the
sum of their gradients is its gradient, up to the order of the additions. (Averaging per-worker
means instead would weight a token by ``1 / (N * n_r)``: a different loss whenever the workers hold
different numbers of real targets, which padding makes the rule.)
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from .checks import is_int, is_real, refusal
from .messages import shown

# Seconds a worker waits for the others in one collective (torch's process group) before it fails
# with an error instead of hanging: long enough for rank 0's held-out evaluation in `twins train`.
TIMEOUT_S = 300.0


# The longest wait `check_timeout` takes, about 31 years: gloo counts a timeout in int64
# nanoseconds (9.2e9 s), and failed ("Invalid timeout") at 8.6e13 s, where `datetime.timedelta`
# itself ends; a longer one was an OverflowError as the workers started.
TIMEOUT_MAX_S = 10**9


def check_timeout(timeout, option: str = "timeout") -> None:
    """Seconds a collective may wait: a real number (not a bool) in (0, `TIMEOUT_MAX_S`] (both
    backends' ``init_workers``, and ``twins train --timeout``). TensorFlow's replicas share one
    process and wait on no peer, but its ``init_workers`` takes the values torch's does (the mirror
    rule)."""
    expected = f"{option}: expected a positive number of seconds, at most {TIMEOUT_MAX_S:,}"
    if not is_real(timeout):
        raise TypeError(f"{expected}, got {shown(timeout)}")
    if not 0 < timeout <= TIMEOUT_MAX_S:  # NaN too; compared as it is (a huge int is no float)
        raise ValueError(f"{expected}, got {shown(timeout, str)}")


def check_worker_count(workers, option: str = "workers") -> None:
    """A worker count: an int of at least 1 (both backends' ``init_workers``, and `check_workers`)."""
    if not is_int(workers) or workers < 1:
        raise refusal(is_int(workers))(f"{option}: expected an int >= 1, got {shown(workers)}")


def check_workers(batch: int, workers: int, option: str = "--workers") -> None:
    """A worker count of at least 1 that divides the global batch (every worker takes equal rows)."""
    check_worker_count(workers, option)
    if not is_int(batch):  # the batch is a count of rows: a NumPy duration failed in a ufunc's words
        raise TypeError(f"batch: expected an int (the global batch's examples), got {shown(batch)}")
    if batch % workers:
        w, b = shown(workers, str), shown(batch, str)
        raise ValueError(f"{option} {w}: expected a number of workers that divides the global batch "
                         f"of {b} examples, got {w} ({b} % {w} = {shown(batch % workers, str)}); "
                         "choose a batch that is a multiple of the workers")


def shard_rows(batch: int, rank: int, workers: int) -> slice:
    """The rows of a global batch of ``batch`` examples that worker ``rank`` of ``workers`` takes:
    ``[rank * b, (rank + 1) * b)`` with ``b = batch / workers``."""
    check_workers(batch, workers)
    if not 0 <= rank < workers:
        raise ValueError(f"rank: expected 0 <= rank < {shown(workers, str)}, got {shown(rank, str)}")
    per = batch // workers
    return slice(rank * per, (rank + 1) * per)


def shard(batch, rank: int, workers: int) -> tuple:
    """Worker ``rank``'s share of a global ``(src, tgt_in, tgt_out)`` batch (rows, padding kept:
    every share has the global batch's lengths)."""
    rows = shard_rows(len(batch[0]), rank, workers)
    return tuple(x[rows] for x in batch)


def target_tokens(tgt_out, pad_id: int) -> int:
    """The number of non-padding targets of a (global) batch: the loss's denominator."""
    return int(np.count_nonzero(np.asarray(tgt_out) != pad_id))


def digest(description: dict) -> str:
    """A short hash of what workers must agree on (config, settings, step, precision...), as JSON
    with sorted keys: equal descriptions give equal digests in every process."""
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def differences(mine: dict, theirs: dict) -> str:
    """``key: a != b`` for every top-level key where two descriptions differ."""
    keys = sorted(set(mine) | set(theirs))
    return ", ".join(f"{k}: {mine.get(k)!r} != {theirs.get(k)!r}" for k in keys
                     if mine.get(k) != theirs.get(k))


def disagreement(descriptions: list) -> str | None:
    """None when every worker's description (or the error it raised, a ``str``) is rank 0's; else
    one line saying which rank failed or differs, and how. The same line on every rank."""
    failed = [(r, d) for r, d in enumerate(descriptions) if isinstance(d, str)]
    if failed:
        return "; ".join(f"worker rank {r} failed: {msg}" for r, msg in failed)
    first = descriptions[0]
    for r, d in enumerate(descriptions[1:], start=1):
        if digest(d) != digest(first):
            return (f"workers disagree: rank {r}'s settings differ from rank 0's "
                    f"({differences(d, first)}); start every worker with the same options and run")
    return None
