"""Data-parallel training on PyTorch's own engine: ``torch.distributed`` with the gloo backend (CPU;
NCCL would be the GPU choice), ``DistributedDataParallel``, one process per worker started by
``torchrun``; mirrored name for name by `tf_impl.distributed` (MirroredStrategy).

    # torchrun --nproc-per-node 2 my_script.py   (sets RANK, WORLD_SIZE, MASTER_ADDR/PORT)
    init_workers()                                      # joins the process group (gloo, a timeout)
    agree({"config": config.to_dict(), ...})            # every worker has the same settings, or all fail
    parallel = DataParallel(config, weights)
    parallel.make_optimizer(warmup=400)
    for step in ...:
        loss, lr = parallel.train_step(global_batch)    # each worker takes its rows of the same batch

Every worker passes the *same global batch*; worker ``rank`` computes on its rows
(`shared.data_parallel.shard_rows`), divides its summed loss by the global batch's non-padding
target count, and DDP's gradient all-reduce **sums** (a communication hook replaces DDP's default
average), so the update equals the one-process update on the whole batch, up to the order of the
additions (`shared.data_parallel` says why the global count matters). Weights stay identical on
every worker: the same summed gradient, the same Adam step.

A collective that waits longer than ``timeout`` seconds fails with an error (gloo's timeout on the
process group), so a worker that died or went astray never leaves the others hanging.
"""
from __future__ import annotations

import gc
import os
from datetime import timedelta
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shared import TransformerConfig
from shared.data_parallel import (TIMEOUT_S, check_timeout, check_worker_count, check_workers, disagreement,
                                  shard_rows, target_tokens)
from shared.training import check_learning_rate

from .cache import _mode
from .model import Transformer
from .training import StepResult, _batch, label_smoothed_loss, make_optimizer


def _sum_hook(state, bucket):
    """DDP communication hook: all-reduce each gradient bucket (a ``dist.GradBucket``) with SUM
    (DDP's default divides by the world size, which would make each worker's loss a mean of means).
    Unannotated: DDP checks the annotation against ``dist.GradBucket`` itself, and this module's
    postponed annotations would be strings."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def init_workers(workers: int | None = None, timeout: float = TIMEOUT_S) -> tuple[int, int]:
    """Join the workers' process group (gloo) once per process; returns ``(rank, workers)``.

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT`` in the environment) the group
    is torchrun's; ``workers``, when given, must equal its ``WORLD_SIZE``. Without torchrun it is a
    group of one (an in-memory store, no port), so one process runs the very same code. Every
    collective of the group raises after ``timeout`` seconds instead of hanging.
    """
    if workers is not None:
        check_worker_count(workers)
    check_timeout(timeout)  # also once the group exists, which keeps its own
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        if workers not in (None, 1):
            raise ValueError(f"workers: {workers} torch workers are separate processes; start them with "
                             f"torchrun --nproc-per-node {workers} (or twins train --workers "
                             f"{workers}), got no RANK/WORLD_SIZE in the environment")
        world = 1
    else:
        world = int(os.environ["WORLD_SIZE"])
        if workers is not None and workers != world:
            raise ValueError(f"workers: expected torchrun's WORLD_SIZE={world}, got {workers}")
    if not dist.is_initialized():
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timedelta(seconds=timeout))
        else:
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size()


def agree(description: Mapping | BaseException) -> None:
    """Every worker calls this with what it must share with the others (config, settings, step,
    precision: a JSON-able dict), or with the error it hit while preparing. Returns when all agree;
    otherwise raises on *every* worker: a failed worker its own error, the others a ``ValueError``
    naming the failed rank and its message, or the rank whose settings differ from rank 0's and
    how. (Call `init_workers` first.)"""
    mine = f"{type(description).__name__}: {description}" if isinstance(description, BaseException) \
        else dict(description)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    problem = disagreement(gathered)
    if problem is None:
        return
    if isinstance(description, BaseException):
        raise description
    raise ValueError(problem)


def broadcast(value: float) -> float:
    """Rank 0's ``value`` on every worker (a decision only rank 0 took, such as stopping)."""
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())


def largest(value: int) -> int:
    """The largest of every worker's ``value`` on every worker (``all_reduce`` with ``MAX``): a
    signal one worker alone received, told to all (`twins train` asks before every step)."""
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def close() -> None:
    """Leave the process group (every worker, at the end; drop your `DataParallel` first).

    A DDP wrapper sits in a reference cycle, so it outlives its last reference until a garbage
    collection; collected during interpreter shutdown, its reducer (which holds the group and the
    Python communication hook) can abort the process ("terminate called without an active
    exception", seen once in CI). Collecting here frees it while the interpreter is whole.
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


class DataParallel:
    """A `Transformer` trained data-parallel by ``DistributedDataParallel`` over gloo.

    Args:
        config, weights: the model and its canonical weights (the same on every worker; DDP also
            broadcasts rank 0's at construction).
        workers: the number of workers; None = torchrun's ``WORLD_SIZE`` (1 without torchrun: a
            process group of one, the same code path).
        timeout: seconds any collective may wait before it raises instead of hanging (used when
            this joins the process group; `init_workers`).

    Attributes: ``model`` (the plain module, for export and evaluation), ``rank``, ``workers``,
    ``optimizer`` (after `make_optimizer`).
    """

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                 workers: int | None = None, timeout: float = TIMEOUT_S):
        self.rank, self.workers = init_workers(workers, timeout)
        self.model = Transformer(config)
        self.model.import_weights(weights)
        self._ddp = DistributedDataParallel(self.model)
        self._ddp.register_comm_hook(None, _sum_hook)
        self.optimizer = None

    def make_optimizer(self, warmup: int = 4000, factor: float = 1.0,
                       start_step: int = 0) -> torch.optim.Adam:
        """`torch_impl.training.make_optimizer` on the model: the same Adam + Noam on every worker."""
        self.optimizer = make_optimizer(self.model, warmup=warmup, factor=factor, start_step=start_step)
        return self.optimizer

    def train_step(self, batch, smoothing: float = 0.0) -> StepResult:
        """One update on the global ``batch = (src (B, S), tgt_in (B, T), tgt_out (B, T))``, the same
        on every worker (``B`` a multiple of the workers); this worker computes on its rows.

        Returns ``StepResult(loss, lr)``: the global batch's loss before the update (the workers'
        shares summed) and the learning rate of this step, the same on every worker.
        """
        if self.optimizer is None:
            raise ValueError("optimizer: call make_optimizer before train_step")
        # a rate set after make_optimizer, refused as one process's step refuses it (Python floats)
        lr = [check_learning_rate(group["lr"]) for group in self.optimizer.param_groups][0]
        src, tgt_in, tgt_out = _batch(self.model, batch)  # checks the global batch, as one process does
        check_workers(src.shape[0], self.workers, "workers")
        rows = shard_rows(src.shape[0], self.rank, self.workers)
        tokens = target_tokens(tgt_out.cpu().numpy(), self.model.config.pad_id)
        with _mode(self._ddp, True):
            logits = self._ddp(src[rows], tgt_in[rows])  # (B / workers, T, V)
        loss = label_smoothed_loss(logits, tgt_out[rows], self.model.config.pad_id, smoothing, tokens)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP sums the workers' gradients (`_sum_hook`) during the backward pass
        self.optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return StepResult(float(total.item()), lr)
