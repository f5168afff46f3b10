"""The kernel layouts of torch_impl's decoding step (`torch_impl.cache.step_layout`), side by side.

Times the products one cached greedy step of preset ``base`` (float32) makes, for each row count
(``batch * beams``) and each layout: every decoder layer's stacked query/key/value, self-attention
output, cross-attention query and output, and the two feed-forward kernels, then the 37000-wide
output projection; each kernel through `torch_impl.cache.lay_out` and `dense`, the code the step
runs. There are 6 copies of every layer's kernels, about 160 MB with the projection, so that, as in
a step, the weights come from memory, not from the cache. Rounds are interleaved (every layout once
per round), so a machine whose speed drifts slows every layout alike. Printed: the median ms per
step's products over the rounds, their range, and the ratio packed / dense; which layout
`step_layout` picks for that row count.

    python3 dev.py bench step_layouts [--rows 1 2 4 8 16] [--rounds 5] [--repeats 20] [--threads 1]

Measured (quiet 2-core AMD EPYC with AVX-512, torch 2.13 CPU, 1 thread, OMP_WAIT_POLICY=PASSIVE,
THP_MEM_ALLOC_ENABLE=1, 5 rounds of 20): see the figures in `torch_impl/cache.py`'s comment above
`PACKED_MIN_ROWS`, which this script reproduces.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from shared import TransformerConfig  # noqa: E402
from shared.threads import apply_thread_policy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per layout and round")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import torch

    from torch_impl.cache import DENSE, PACKED, dense, lay_out, step_layout

    torch.set_num_threads(args.threads)
    config = TransformerConfig.preset("base")
    d, inner, ff = config.d_model, config.n_heads * config.d_k, config.d_ff
    shapes = [(d, 3 * inner), (inner, d), (d, inner), (inner, d), (d, ff), (ff, d)]
    g = torch.Generator().manual_seed(0)
    kernels = [(torch.randn(i, o, generator=g) * i ** -0.5, torch.randn(o, generator=g))
               for _ in range(config.n_decoder_layers) for i, o in shapes]
    kernels.append((torch.randn(d, config.tgt_vocab, generator=g) * d ** -0.5,
                    torch.randn(config.tgt_vocab, generator=g)))
    megabytes = sum(k.numel() for k, _ in kernels) * 4 / 1e6
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; {len(kernels)} products, {megabytes:.0f} MB "
          f"of kernels a step; {args.rounds} rounds of {args.repeats} steps")
    print(" rows   dense ms (range)        packed ms (range)       packed/dense   step_layout picks")
    laid = {layout: [(lay_out(k, layout), b) for k, b in kernels] for layout in (DENSE, PACKED)}
    for rows in args.rows:
        xs = {n: torch.randn(rows, n, generator=g) for n in {i for i, _ in shapes}}

        def step(layout: str) -> None:
            for kernel, bias in laid[layout]:
                width = kernel.shape[1] if kernel.is_mkldnn else kernel.shape[0]  # packed: (out, in)
                dense(xs[width], kernel, bias)

        for layout in laid:
            step(layout)  # first-call allocations
        ms = {layout: [] for layout in laid}
        for _ in range(args.rounds):
            for layout in laid:
                start = time.perf_counter()
                for _ in range(args.repeats):
                    step(layout)
                ms[layout].append((time.perf_counter() - start) / args.repeats * 1e3)
        med = {layout: statistics.median(v) for layout, v in ms.items()}
        cells = [f"{med[lay]:7.2f} ({min(ms[lay]):.2f}-{max(ms[lay]):.2f})" for lay in (DENSE, PACKED)]
        picks = step_layout(rows, torch.device("cpu"), torch.float32)
        print(f"{rows:5d}   {cells[0]:22s}  {cells[1]:22s}  {med[PACKED] / med[DENSE]:6.2f}x        {picks}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
