"""Steps per second of data-parallel training (`twins train`'s copy model and settings, global batch
128), after warm-up (TF's trace and the first steps are not timed).

    PYTHONPATH=. python benchmarks/data_parallel_speed.py --backend tf --workers 2
    PYTHONPATH=. torchrun --nproc-per-node 2 benchmarks/data_parallel_speed.py --backend torch --workers 2

One thread per worker (``--threads``), so N workers use N cores. Prints one line (rank 0).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from twins import demo_tasks as tasks  # noqa: E402
from twins.backends import make_adapter, prepare  # noqa: E402
from shared.threads import check_worker_limit, thread_count  # noqa: E402
from shared.weights import init_weights  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["torch", "tf"], required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--threads", type=thread_count, default=1)
    args = parser.parse_args()
    spec = tasks.spec("copy")
    try:
        check_worker_limit(args.workers, spec.batch)  # before any framework starts
    except ValueError as err:
        parser.error(str(err))
    config = tasks.task_config("copy")
    prepare(args.backend, threads=args.threads)
    adapter = make_adapter(args.backend, config, init_weights(config, 0), seed=0, threads=args.threads,
                           workers=args.workers)
    adapter.make_optimizer(spec.warmup, spec.factor, 0)
    data = tasks.TrainingData("copy", 0, spec.batch, config.start_id)
    batches = [data.batch(k) for k in range(1, args.steps + args.warmup_steps + 1)]
    for b in batches[: args.warmup_steps]:
        adapter.train_step(b, spec.smoothing)
    start = time.perf_counter()
    for b in batches[args.warmup_steps:]:
        adapter.train_step(b, spec.smoothing)
    seconds = time.perf_counter() - start
    if adapter.parallel is None or adapter.parallel.rank == 0:
        print(f"{args.backend} workers={args.workers} batch={spec.batch}: {args.steps / seconds:.2f} steps/s "
              f"({seconds / args.steps * 1e3:.0f} ms/step)", flush=True)
    adapter._distributed().close()


if __name__ == "__main__":
    main()
