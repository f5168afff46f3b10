"""A CPU decode's step products packed for oneDNN or dense, whole decodes side by side.

From `torch_impl.cache.PACKED_MIN_ROWS` rows a cached step's float32 products on the CPU take
oneDNN's packed kernels, below it MKL's addmm on dense ``(in, out)`` kernels (`step_layout`: from 2
rows on every CPU). Which is faster at one row differs from one machine to another, of one vendor
too (docs/performance.md, "One row dense on every CPU"): this times both on yours, in whole
decodes; `benchmarks/step_layouts.py` times the products alone.
One model of ``base`` (float32, `benchmarks/_decoding_contenders`: EOS never chosen, so every
decode runs to its limit, sources of 32 tokens) decodes each batch twice a round: its steps packed
(``PACKED_MIN_ROWS = 1``) and dense (``PACKED_MIN_ROWS`` above the step's rows), alternately,
every other round in reverse; the encoder pass is packed in both (its rows are the batch's source
tokens). Both sets of laid-out weights are kept by the model after the first decode of each, as a
decode keeps them.

Printed per batch: the rows a step has, which layout the rule picks for them on this CPU, ms a
token of whole decodes of ``--tokens`` tokens (the median of the rounds) in each layout, the median
of the per-round ratios dense / packed (below 1: dense is faster here), and whether the two chose
the same tokens (they round differently, so a near tie could differ; on `base`'s random weights
they have not).

    python3 dev.py bench packed_rows [--batches 1 2] [--beam-size 1] [--tokens 64] [--rounds 5]
                                     [--threads 1]

Measured: docs/performance.md ("A slow AMD EPYC, where the packed kernel loses at one row", "One row
dense on every CPU").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared.threads import apply_thread_policy, thread_count  # noqa: E402
from _args import positive  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=positive, nargs="+", default=[1, 2])
    parser.add_argument("--beam-size", type=positive, default=1, help="1: greedy")
    parser.add_argument("--tokens", type=positive, default=64, help="tokens a decode")
    parser.add_argument("--rounds", type=positive, default=5)
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import numpy as np
    import torch

    import torch_impl
    import torch_impl.cache
    from _decoding_contenders import bench_weights, contender_config
    from decoding import sources
    torch.set_num_threads(args.threads)
    config = contender_config()
    model = torch_impl.Transformer(config)
    model.import_weights(bench_weights(config))
    model.eval()
    rule = torch_impl.cache.PACKED_MIN_ROWS
    cpu = torch.device("cpu")

    def decode(min_rows: int, src: np.ndarray):
        """Seconds of one decode with ``PACKED_MIN_ROWS = min_rows``, and its tokens."""
        torch_impl.cache.PACKED_MIN_ROWS = min_rows
        try:
            start = time.perf_counter()
            if args.beam_size == 1:
                out = torch_impl.greedy_decode(model, src, args.tokens + 1)
            else:
                out = torch_impl.beam_search(model, src, args.tokens + 1, args.beam_size, 0.6)
            return time.perf_counter() - start, out.tokens
        finally:
            torch_impl.cache.PACKED_MIN_ROWS = rule

    search = "greedy" if args.beam_size == 1 else f"beam search of {args.beam_size}"
    print(f"torch {torch.__version__}, cpu ({torch.backends.cpu.get_cpu_capability()}, "
          f"PACKED_MIN_ROWS {rule}), {torch.get_num_threads()} threads, preset base float32, {search}, "
          f"{args.tokens} tokens a decode, {args.rounds} rounds")
    print(f"{'batch':>5s} {'rows':>5s}  {'rule picks':<18s} {'packed ms':>10s} {'dense ms':>9s} "
          f"{'dense/packed':>13s}  same tokens")
    for batch in args.batches:
        rows = batch * args.beam_size
        arms = {"packed": 1, "dense": rows + 1}
        src = sources(config, batch)
        tokens = {arm: decode(min_rows, src)[1] for arm, min_rows in arms.items()}  # warm-up: lays out
        same = "yes" if np.array_equal(tokens["packed"], tokens["dense"]) else "NO"
        times = {arm: [] for arm in arms}
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else reversed(arms)):
                times[arm].append(decode(arms[arm], src)[0] / args.tokens * 1e3)
        ratio = statistics.median(d / p for d, p in zip(times["dense"], times["packed"]))
        picks = torch_impl.cache.step_layout(rows, cpu, torch.float32)
        print(f"{batch:5d} {rows:5d}  {picks:<18s} {statistics.median(times['packed']):10.2f} "
              f"{statistics.median(times['dense']):9.2f} {ratio:12.3f}x  {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
