"""How far above `shared.memory.training_floor` a real training step's memory goes.

`twins train` refuses a ``--batch`` whose floor (what the backward pass must keep) exceeds the
machine's memory; a batch under the floor may still not fit. This measures by how much: for each
backend and demo task, one process draws the task's batch of ``--rows`` rows, takes a warm-up
training step on two of them (tracing, the optimizer's moments), then one step on the whole batch,
and prints the rise of its peak resident memory (``ru_maxrss``) over its resident memory before
that step, against the floor at the batch's own lengths. Each backend runs in its own process, so
one's peak is not the other's.

    python3 dev.py bench training_floor [--rows 20000] [--tasks copy dates] [--backends torch tf]

Measured: docs/performance.md ("Training memory against its floor").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import gc, json, resource, sys
from shared.memory import training_floor
from shared.weights import init_weights
from twins import demo_tasks
from twins.backends import make_adapter
backend, task, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = demo_tasks.task_config(task)
data = demo_tasks.TrainingData(task, 0, rows, config.start_id)
batch = data.batch(1)
adapter = make_adapter(backend, config, init_weights(config, 0), threads=1)
adapter.make_optimizer(400, 0.5, 0)
adapter.train_step(tuple(part[:2] for part in data.batch(2)), 0.1)
gc.collect()
before = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize())
adapter.train_step(batch, 0.1)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
floor = training_floor(config, rows, batch[0].shape[1], batch[1].shape[1])
print(json.dumps({"src_len": batch[0].shape[1], "tgt_len": batch[1].shape[1],
                  "rise": max(0, peak - before), "floor": floor}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--tasks", nargs="+", default=["copy", "dates"], choices=["copy", "dates"])
    parser.add_argument("--backends", nargs="+", default=["torch", "tf"], choices=["torch", "tf"])
    args = parser.parse_args(argv)
    print(f"one training step of {args.rows:,} rows, the task's default model, float32, 1 thread")
    print(f"{'backend':8} {'task':6} {'S':>3} {'T':>3} {'peak rise MiB':>14} {'floor MiB':>10} {'ratio':>6}")
    for task in args.tasks:
        for backend in args.backends:
            done = subprocess.run([sys.executable, "-c", CHILD, backend, task, str(args.rows)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{backend:8} {task:6} failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            got = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{backend:8} {task:6} {got['src_len']:3d} {got['tgt_len']:3d} "
                  f"{got['rise'] / 2**20:14,.0f} {got['floor'] / 2**20:10,.0f} "
                  f"{got['rise'] / got['floor']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
