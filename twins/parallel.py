"""`twins train --workers N`: data-parallel training on each framework's own engine.

* torch: N processes, DistributedDataParallel over gloo. ``twins train --backend torch --workers N``
  launches them with torchrun's own launcher (``torch.distributed.launcher.elastic_launch``, a
  standalone rendezvous on a free local port), each running this same command; or start them by
  hand: ``torchrun --nproc-per-node N -m twins train --backend torch ...``.
* tf: one process, ``tf.distribute.MirroredStrategy`` over N logical CPU devices.

Every worker draws the same global batch (``--batch``, the batch of step k is a function of the
seed and k) and computes on its ``batch / N`` rows (`shared.data_parallel`); rank 0 alone evaluates,
prints and writes the run directory. Workers first agree (`agree`): a worker that failed while
preparing, or whose settings differ from rank 0's, makes every worker fail with a clear message;
each collective of torch's process group times out (``--timeout``) rather than hang.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import uuid

from . import backends, pipes


# A worker's exit status after SIGINT or SIGTERM stopped it and rank 0 saved (128 + the signal).
INTERRUPTED = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def in_torchrun() -> bool:
    """This process is a worker started by torchrun (or by `launch`)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def must_launch(args) -> bool:
    """``--workers N > 1`` on torch, outside torchrun: this process launches the workers."""
    return args.backend == "torch" and (args.workers or 1) > 1 and not in_torchrun()


def launch(args) -> int:
    """Run ``twins train`` (these same arguments) in ``--workers`` processes started by torchrun's
    launcher; returns the exit status: 0; 2 when the workers refused their input (each has printed
    its own one-line error); `pipes.EXIT_PIPE`, silently, when rank 0 met a closed stdout (the
    others then fail after it); 128 + the signal (130, 143), silently, when SIGINT or SIGTERM
    stopped the run (saved by rank 0); 1 when a worker died (one line: which rank, and how). Torch threads
    per worker: ``--threads``, else the cores divided among them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if not getattr(args, "verbose", False):  # the agent's own log lines; the workers speak for themselves
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # The agent's log folder, removed afterwards: by default it makes /tmp/torchelastic_* at every
    # launch and leaves it (hundreds of them after a day of test runs).
    logs = tempfile.TemporaryDirectory(prefix="twins-torchrun-", ignore_cleanup_errors=True)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=args.workers,
                          run_id=str(uuid.uuid4()), rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          max_restarts=0, monitor_interval=0.1,
                          logs_specs=DefaultLogsSpecs(log_dir=logs.name))
    try:
        with logs:
            elastic_launch(config, sys.executable)("-m", "twins", *args.argv)
    except SignalException as err:
        # SIGINT or SIGTERM reached the launcher (Ctrl-C reaches every process of the group): its
        # agent has passed the signal on to the workers and waited for them to end; rank 0 has
        # saved the run ("interrupted at step N"), so this ends as one process would, 128 + signal.
        return 128 + int(err.sigval)
    except ChildFailedError as err:
        codes = {rank: f.exitcode for rank, f in sorted(err.failures.items())}
        if pipes.EXIT_PIPE in codes.values() and pipes.stdout_reader_gone():
            return pipes.EXIT_PIPE
        positive = [c for c in codes.values() if c and c > 0]
        if positive == [2] * len(positive) and positive:
            return 2  # the workers' own "twins train: error: ..." lines said why
        if positive and len(set(positive)) == 1 and positive[0] in INTERRUPTED:
            return positive[0]  # the workers had the signal, not the launcher: rank 0 saved the run
        print(f"twins train: error: --workers {args.workers}: {failure_message(codes)}", file=sys.stderr)
        return 1
    return 0


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def failure_message(codes: dict[int, int]) -> str:
    """One line for the workers that failed, ``{rank: exit status}`` (negative: the signal that
    killed it, as ``subprocess`` reports it): which rank died and how, then the ranks the launcher
    stopped afterwards (SIGTERM), so the cause is not lost among its consequences."""
    stopped = {r: c for r, c in codes.items() if c == -signal.SIGTERM}
    causes = {r: c for r, c in codes.items() if r not in stopped} or stopped
    text = "; ".join(f"worker rank {r} {_how(c)}" for r, c in causes.items())
    after = [r for r in stopped if r not in causes]
    if after:
        ranks = ", ".join(map(str, after))
        text += f" (the launcher then stopped rank{'s' if len(after) > 1 else ''} {ranks} with SIGTERM)"
    return text


def distributed(backend: str, threads: int | None = None):
    """The backend's ``distributed`` module (torch_impl's or tf_impl's), the framework set up first
    (thread pools before TensorFlow's runtime starts)."""
    return backends.distributed(backend, threads)


def describe(args, config, log: dict, workers: int) -> dict:
    """What every worker must share: the digest `agree` compares."""
    return {"task": log["task"], "seed": log["seed"], "step": log["step"], "settings": log["settings"],
            "config": config.to_dict(), "workers": workers, "backend": args.backend,
            "steps": args.steps, "eval_every": args.eval_every, "heldout": args.heldout,
            "stop_at": args.stop_at}
