"""A worker of `test_distributed.py`, run in its own process(es): ``python -m
parity_tests.distributed_worker {torch,tf} OUT_DIR`` (torch under torchrun, one process per
worker; TF alone, its 2 replicas being logical CPU devices of one process).

For float64 and float32 it trains the same tiny model from the same weights for `STEPS` Adam + Noam
steps twice: data-parallel over 2 workers (the backend's `DataParallel`) and in one process
(`training.train_step`, the whole batch), and writes both trajectories (weights after every step,
losses, learning rates) to ``OUT_DIR/{backend}-{dtype}.npz`` (rank 0 only). Then it checks, on every
rank, that bad input fails everywhere: a batch the workers do not divide, one worker's error, and
(torch) settings that differ between workers; what each rank saw goes to
``OUT_DIR/{backend}-errors-{rank}.json``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from shared import tasks
from shared.weights import random_weights

STEPS, WARMUP, FACTOR, WORKERS = 4, 10, 0.1, 2


def config(dtype: str):
    from parity_tests.matrix import VARIANTS
    # 1+1 layers: tracing the replicated TF step is the slow part of this test.
    return VARIANTS["tiny-shared-tied-post"].replace(
        src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB, dtype=dtype, dropout=0.0,
        n_encoder_layers=1, n_decoder_layers=1)


def batches():
    """STEPS global batches of 4 copy sequences of lengths 10, 8, 4, 2: worker 0's rows hold 20
    targets, worker 1's 8, so a mean of per-worker means would not be the batch's mean."""
    pairs = tasks.copy_examples(4 * STEPS, 7)
    for i in range(STEPS):
        sources = [s[:n] for n, (s, _) in zip((10, 8, 4, 2), pairs[4 * i: 4 * i + 4])]
        yield tasks.batch_sequences(sources, sources)


def trajectories(backend: str, dtype: str) -> dict[str, np.ndarray]:
    if backend == "torch":
        from torch_impl import Transformer, training
        from torch_impl.distributed import DataParallel
    else:
        from tf_impl import Transformer, training
        from tf_impl.distributed import DataParallel
    c = config(dtype)
    weights = random_weights(c, 0)
    parallel = DataParallel(c, weights, workers=WORKERS)
    parallel.make_optimizer(warmup=WARMUP, factor=FACTOR)
    single = Transformer(c)
    single.import_weights(weights)
    optimizer = training.make_optimizer(single, warmup=WARMUP, factor=FACTOR)
    out = {}
    for step, batch in enumerate(batches(), start=1):
        a = parallel.train_step(batch)
        b = training.train_step(single, optimizer, batch)
        out[f"loss.parallel.{step}"], out[f"loss.single.{step}"] = np.array(a.loss), np.array(b.loss)
        out[f"lr.parallel.{step}"], out[f"lr.single.{step}"] = np.array(a.lr), np.array(b.lr)
        for kind, model in (("parallel", parallel.model), ("single", single)):
            for name, value in model.export_weights().items():
                out[f"{kind}.{step}.{name}"] = value
    return out, parallel


def bad_input(parallel, distributed, rank: int) -> dict[str, str]:
    """What each misuse raised on this rank (every rank must raise; none may hang)."""
    seen = {}
    src, tgt_in, tgt_out = next(batches())
    try:  # 3 rows for 2 workers: refused on every rank before any collective
        parallel.train_step((src[:3], tgt_in[:3], tgt_out[:3]))
    except ValueError as err:
        seen["indivisible"] = str(err)
    if hasattr(parallel.optimizer, "param_groups"):  # torch: a rate set after make_optimizer
        group = parallel.optimizer.param_groups[0]
        kept, group["lr"] = group["lr"], float("nan")
        try:  # refused on every rank before any collective, as one process's step refuses it
            parallel.train_step((src, tgt_in, tgt_out))
        except ValueError as err:
            seen["rate"] = str(err)
        group["lr"] = kept
    try:  # rank 1 failed while preparing: rank 1 raises its error, the others name it
        distributed.agree(OSError("disk on fire") if rank == 1 else {"seed": 0})
    except (ValueError, OSError) as err:
        seen["failed"] = f"{type(err).__name__}: {err}"
    try:  # rank 1 has another warmup: every rank says so
        distributed.agree({"seed": 0, "warmup": 400 + 100 * rank})
    except ValueError as err:
        seen["mismatch"] = str(err)
    distributed.agree({"seed": 0, "warmup": 400})  # the same everywhere: passes
    seen["agreed"] = "yes"
    return seen


def main(backend: str, out: str) -> None:
    out_dir = Path(out)
    parallel = None
    for dtype in ("float64", "float32"):
        result, parallel = trajectories(backend, dtype)
        if parallel.rank == 0:
            np.savez(out_dir / f"{backend}-{dtype}.npz", **result)
    if backend == "torch":
        from torch_impl import distributed
    else:
        from tf_impl import distributed
    seen = bad_input(parallel, distributed, parallel.rank)
    (out_dir / f"{backend}-errors-{parallel.rank}.json").write_text(json.dumps(seen))
    del parallel  # before close: its DDP wrapper is freed there, not during interpreter shutdown
    distributed.close()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1], sys.argv[2])
