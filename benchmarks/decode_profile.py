"""Where a cached decode's time goes, operation by operation, and how each grows with its length.

torch_impl's cached decoding of preset ``base`` (float32, `benchmarks/_decoding_contenders`:
`contender_config` and `bench_weights`, EOS suppressed, so every row runs to the limit), greedy or
beam search, on the CPU or a GPU, decoded once per ``--tokens`` count under ``torch.profiler``
after a timed decode without it. Printed per batch: each count's ms a step (the decode without the
profiler), then the operations of most own time at the longest count, each with its own time and
calls per step at every count: an operation whose time grows with the count works on the cached
positions (attention, the cache's writes); one that stays flat is the step's fixed work. On a GPU
the time is the device's (``self_device_time_total``); there a step's host cost is what
`benchmarks/gpu_profile.py` splits.

The header also names the system's transparent-huge-page mode and, after each batch, how much of
the process's memory is on huge pages (Linux): a step streams every weight once, and on 4 KB
pages that is one TLB miss per page (torch's allocator asks for huge pages under
``THP_MEM_ALLOC_ENABLE=1``, which `shared.threads` sets, where the system's mode allows it).

``--attention math`` runs the same decodes under ``sdpa_kernel([SDPBackend.MATH])`` instead of the
kernel torch picks, a variant to compare on a given CPU, not one torch_impl runs.

    python3 dev.py bench decode_profile [--batches 1] [--tokens 16 128] [--beam-size 1] [--top 15]
                                        [--threads 1] [--device cpu|cuda] [--attention default|math]

Measured: docs/performance.md ("The CPU contenders on two CPUs", "Beam search on the CPU").
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _decoding_contenders, decoding

from shared.threads import apply_thread_policy, thread_count  # noqa: E402
from _args import positive  # noqa: E402


def _huge_pages() -> str:
    """The process's anonymous memory on transparent huge pages, from /proc (Linux), or ''."""
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup"))
    except OSError:
        return ""
    mb = {key: int(fields[key].split()[0]) / 1024 for key in ("AnonHugePages", "Anonymous") if key in fields}
    return f"; anonymous memory on huge pages: {mb.get('AnonHugePages', 0):.0f} of {mb.get('Anonymous', 0):.0f} MB"


def _thp_mode() -> str:
    """The system's transparent-huge-page mode (the bracketed word), or 'unknown'."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", nargs="+", type=positive, default=[1])
    parser.add_argument("--tokens", nargs="+", type=positive, default=[16, 128],
                        help="new tokens per decode, one profiled decode each (at most the preset's max_len)")
    parser.add_argument("--beam-size", type=positive, default=1, help="1: greedy (default)")
    parser.add_argument("--top", type=positive, default=15, help="operations shown")
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--attention", default="default", choices=["default", "math"])
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import torch
    from torch.profiler import ProfilerActivity, profile

    import torch_impl
    from _cuda import cuda_missing
    from _decoding_contenders import bench_weights, contender_config
    from decoding import sources

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and (why := cuda_missing()):
        parser.error(f"--device cuda: {why}")
    torch.backends.cuda.matmul.allow_tf32 = False  # as the parity tests
    config = contender_config()
    if max(args.tokens) > config.max_len:
        parser.error(f"--tokens: expected at most the preset's max_len {config.max_len}, got {max(args.tokens)}")
    model = torch_impl.Transformer(config)
    model.import_weights(bench_weights(config))
    model = model.to(args.device).eval()

    def decode(src, n):
        if args.beam_size == 1:
            return torch_impl.greedy_decode(model, src, n)
        return torch_impl.beam_search(model, src, n, args.beam_size)

    def attention():
        if args.attention == "default":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.MATH])

    search = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}"
    clock = "device" if cuda else "CPU"
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, preset base float32, "
          f"{search}, EOS suppressed, attention: {args.attention}; own {clock} time per step; "
          f"transparent huge pages: {_thp_mode()}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for batch in args.batches:
        src = sources(config, batch)
        per_step, ops = {}, {}
        with attention():
            for n in args.tokens:
                decode(src, n)  # warm: caches, packed weights, the allocator
                start = time.perf_counter()
                decode(src, n)
                per_step[n] = (time.perf_counter() - start) / n * 1e3
                with profile(activities=activities) as prof:
                    decode(src, n)
                    if cuda:
                        torch.cuda.synchronize()
                for event in prof.key_averages():
                    own = event.self_device_time_total if cuda else event.self_cpu_time_total
                    ops.setdefault(event.key, {})[n] = (own / n / 1e3, event.count / n)
        longest = max(args.tokens)
        shown = sorted(ops, key=lambda name: -ops[name].get(longest, (0.0, 0))[0])[:args.top]
        print(f"\nbatch {batch}: " + ", ".join(f"{n} tokens {ms:.2f} ms/step" for n, ms in per_step.items())
              + _huge_pages())
        print(f"{'operation':44s}" + "".join(f"{f'{n} tok ms':>12s}{'calls':>7s}" for n in args.tokens))
        for name in shown:
            cells = "".join(f"{ops[name].get(n, (0.0, 0))[0]:12.3f}{ops[name].get(n, (0.0, 0))[1]:7.1f}"
                            for n in args.tokens)
            print(f"{name[:43]:44s}{cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
