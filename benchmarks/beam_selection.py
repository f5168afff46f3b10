"""Beam search's token selection two ways, side by side: topk with its ties settled, and a whole-row sort.

Beam search ranks each beam's V logits for its 2K best tokens, ties by lowest id (`shared.decoding`,
step 2; docs/design.md, convention 11): the first k of ``torch.sort(descending=True,
stable=True)``. `torch_impl.search._top_lowest` takes them on the CPU by ``torch.topk`` of k + 1
and a fix of the ties across the k-th value (`_topk_lowest`), and on a GPU by that sort itself,
which was faster there (each with the same indices: parity_tests/test_decoding_torch_only.py,
``test_beam_selection_is_the_first_k_of_the_stable_descending_sort``). This times whole beam
searches of preset ``base`` (float32, `benchmarks/_decoding_contenders.bench_weights`: EOS
suppressed, so every hypothesis runs to the limit) both ways on ``--device``, in one process,
interleaved by round, and checks that both return the same tokens and scores. Printed: ms per step
(a whole decode, encoder included, divided by the new tokens; median of the rounds; results on
the host, so a GPU's work is inside it), the median of the per-round ratios, and which way the
device's search takes. TF32 off on a GPU, as in the parity tests.

Where the rest of a beam step's time goes: `benchmarks/decode_profile.py --beam-size`.

    python3 dev.py bench beam_selection [--batches 1 8] [--beam-size 4] [--tokens 32] [--rounds 5]
                                        [--threads 1] [--device cpu|cuda]

Measured: docs/performance.md, "Beam search on the CPU".
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _decoding_contenders, decoding

from shared import TransformerConfig  # noqa: E402
from shared.threads import apply_thread_policy, thread_count  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per decode")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import numpy as np
    import torch

    import torch_impl
    from _cuda import cuda_missing
    from _decoding_contenders import bench_weights
    from decoding import sources
    from torch_impl import search

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if why := cuda_missing():
            print(f"beam_selection.py: --device cuda: {why}", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False
    config = TransformerConfig.preset("base")
    model = torch_impl.Transformer(config)
    model.import_weights(bench_weights(config))
    model = model.to(args.device).eval()
    top_lowest = search._top_lowest

    def whole_sort(x: torch.Tensor, k: int) -> torch.Tensor:
        return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]

    def topk(x: torch.Tensor, k: int) -> torch.Tensor:  # rows of a few entries are sorted either way
        return search._topk_lowest(x, k) if 2 * k < x.shape[-1] else whole_sort(x, k)

    ways = {"topk": topk, "whole-row sort": whole_sort}
    taken = "topk" if args.device == "cpu" else "whole-row sort"  # as `_top_lowest` chooses
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, preset base "
          f"float32, beam {args.beam_size}, {args.tokens} new tokens, EOS suppressed, {args.rounds} rounds; "
          f"the search on {args.device} takes: {taken}")
    print(f"{'batch':>5s}  " + "  ".join(f"{name + ' ms/step':>24s}" for name in ways) + "   sort / topk")
    try:
        for batch in args.batches:
            src = sources(config, batch)
            seconds = {name: [] for name in ways}
            results = {}
            for round_ in range(args.rounds + 1):  # round 0: warm-up, and the results compared
                for name, select in ways.items():
                    search._top_lowest = select
                    start = time.perf_counter()
                    result = torch_impl.beam_search(model, src, args.tokens, args.beam_size)
                    elapsed = time.perf_counter() - start
                    if round_ == 0:
                        results[name] = result
                    else:
                        seconds[name].append(elapsed)
            first, second = results.values()
            for field in first._fields:
                if not np.array_equal(getattr(first, field), getattr(second, field)):
                    raise AssertionError(f"batch {batch}: the two selections differ in {field}")
            ms = [statistics.median(seconds[name]) / args.tokens * 1e3 for name in ways]
            ratio = statistics.median(b / a for a, b in zip(*seconds.values()))
            print(f"{batch:5d}  " + "  ".join(f"{m:24.2f}" for m in ms) + f"   {ratio:10.2f}x", flush=True)
    finally:
        search._top_lowest = top_lowest
    return 0


if __name__ == "__main__":
    sys.exit(main())
