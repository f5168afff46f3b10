"""The cross-attention fold (`torch_impl.cache.CrossFold`) on and off, side by side in one process.

torch_impl folds each layer's cross-attention into one item's short source (`folds_source`): a
step then reads two products around a softmax instead of the query product, attention and the
output product. This benchmark times cached decoding of ``base`` (float32,
`benchmarks/_decoding_contenders`: EOS never chosen, so every decode runs to its limit) at batch
1 (greedy, or a beam search of ``--beam-size`` beams, length penalty 0.6), each decode with the
fold (as torch_impl decides on the CPU) or without it (`folds_source` answering no), alternately,
every other round in reverse. On CUDA, where `folds_source` declines
(a graphed step is bound by its launches), the fold is forced: the rule asked as if on the CPU,
to measure what it would gain there. On the CPU one model decodes both ways (a decode makes
its cache, and so its fold, anew; two models would differ by where their memory lies, 1-3% a
step); on CUDA two models of the same weights, so that each keeps its own graph
(`torch_impl.graphs`: a model keeps its latest, and the fold is part of what it recorded).
Printed per source length: ms a token of whole decodes of ``--tokens`` tokens (the encoder pass
and the fold's making included: ``--tokens 8`` shows what the making costs), the median of the
rounds, with the median of the per-round ratios folded / unfolded, and whether both chose the
same tokens.

    python3 dev.py bench cross_fold [--device cpu|cuda] [--src-len 12 32 64] [--tokens 64]
                                    [--beam-size 1] [--rounds 7] [--threads 1]

Measured: docs/performance.md ("Cross-attention folded into the source").
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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--src-len", type=positive, nargs="+", default=[12, 32, 64],
                        help="source lengths, one row each (the rule folds up to 73 for base)")
    parser.add_argument("--tokens", type=positive, default=64, help="tokens a decode")
    parser.add_argument("--beam-size", type=positive, default=1, help="1: greedy")
    parser.add_argument("--rounds", type=positive, default=7)
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)
    from _cuda import cuda_missing
    if args.device == "cuda" and (why := cuda_missing()):
        parser.error(f"--device cuda: {why}")

    import numpy as np
    import torch

    import torch_impl
    import torch_impl.stacks
    from _decoding_contenders import bench_weights, contender_config
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # as the parity tests
    config = contender_config()
    weights = bench_weights(config)
    models = {}
    for folded in (True, False):
        if folded or args.device == "cuda":  # the CPU: one model both ways (see above)
            model = torch_impl.Transformer(config)
            model.import_weights(weights)
            models[folded] = model.to(args.device).eval()
        else:
            models[folded] = models[True]
    rule = torch_impl.stacks.folds_source
    if args.device == "cuda":  # the CPU's rule, on CUDA (see above)
        def fold(items, src_len, d_model, d_k, device, *dtypes):
            return rule(items, src_len, d_model, d_k, torch.device("cpu"), *dtypes)
    else:
        fold = rule

    def decode(folded: bool, src: torch.Tensor, n: int):
        """Seconds of one decode of ``n`` tokens, and its tokens."""
        torch_impl.stacks.folds_source = fold if folded else (lambda *_: False)
        try:
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            if args.beam_size == 1:
                out = torch_impl.greedy_decode(models[folded], src, n)
            else:
                out = torch_impl.beam_search(models[folded], src, n, args.beam_size, 0.6)
            return time.perf_counter() - start, out.tokens
        finally:
            torch_impl.stacks.folds_source = rule

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, preset base float32, "
          f"{'greedy' if args.beam_size == 1 else f'beam search of {args.beam_size}'} at batch 1 of "
          f"{args.tokens} tokens, {args.rounds} rounds")
    print(f"{'source':>6s} {'fold':>5s} {'ms a token':>11s} {'vs unfolded':>12s}  same tokens")
    rng = np.random.default_rng(0)
    for length in args.src_len:
        src = torch.from_numpy(rng.integers(3, config.src_vocab, (1, length))).to(args.device)
        tokens = {folded: decode(folded, src, args.tokens)[1] for folded in (True, False)}  # warm-up
        same = "yes" if np.array_equal(tokens[True], tokens[False]) else "NO"
        d_k = config.head_dim or config.d_model // config.n_heads
        if not fold(1, length, config.d_model, d_k, torch.device(args.device), torch.float32, torch.float32):
            same += " (the rule declines this source: both unfolded)"
        times = {True: [], False: []}
        for r in range(args.rounds):
            for folded in ((True, False) if r % 2 == 0 else (False, True)):
                times[folded].append(decode(folded, src, args.tokens)[0] / args.tokens * 1e3)
        for folded in (True, False):
            ratio = statistics.median(a / b for a, b in zip(times[folded], times[False]))
            print(f"{length:6d} {'on' if folded else 'off':>5s} {statistics.median(times[folded]):11.3f} "
                  f"{ratio:11.3f}x  {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
