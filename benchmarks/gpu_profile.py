"""Where a cached greedy decode's time goes on a CUDA device: the figures of docs/performance.md, "GPU".

Four parts, the first three on the decoding benchmark's model (`benchmarks/_decoding_contenders.py`: preset
``base`` in the form every contender computes, EOS never chosen, 32-token padded sources) and its
torch_impl contender (a CUDA graph a step, float32 products without TF32):

* ``kernels``: one 64-token decode under ``torch.profiler``, its CUDA kernels summed by name: the
  kernel time a token against the decode's wall time a token (the difference is the host's: the
  decode's fixed cost, the GPU idle), then the kernels that take the most, by precision and batch;
* ``fixed``: a decode's fixed cost, part by part: whole decodes of 2, 64 and 128 tokens (the same
  length repeated, so the kept graph replays), then each part of a decode timed between
  synchronisations (the encoder pass, the cache's set-up, the weights' checks, ...);
* ``attention``: one query's attention, twelve calls replayed from one CUDA graph as a step makes
  them, SDPA against two batched products around a softmax, float32 and bfloat16, over 32 and 128
  keys (why `torch_impl.attention._attend_buffer` takes the products in float32);
* ``residual``: a bfloat16 sublayer's output into the float32 residual stream (the precision rule,
  `shared/precision.py`), eighteen calls replayed from one graph as a step of base makes them: the
  step's product then a mixed-dtype add, against a cast then a float32 add, and against cuBLAS
  writing the product in float32 straight into the stream (``addmm``'s ``out_dtype``, CUDA only;
  rounded once, not twice, so not the step's rounding), with float32's product and add beside
  them; and a layer norm of the stream with and without its cast to bfloat16.

    python3 dev.py bench gpu_profile [--parts kernels fixed attention residual]

Timings only; nothing is compared with a target. The figures vary by a few percent between runs
and machines of one kind: compare within one run.
"""
from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cuda import cuda_missing  # noqa: E402

PARTS = ("kernels", "fixed", "attention", "residual")


def _contender(precision: str):
    """``(config, decode(src, max_len))``: the decoding benchmark's torch_impl on CUDA."""
    import _decoding_contenders as C
    config = C.contender_config()
    return config, C.torch_contender(config, C.bench_weights(config),
                                     C.Settings(threads=1, device="cuda", precision=precision)).decode


def _wall(decode, src, max_len: int, repeats: int) -> float:
    """Median seconds of ``repeats`` decodes, after three that record or warm what they keep."""
    import torch
    for _ in range(3):
        decode(src, max_len)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        decode(src, max_len)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernels(top: int = 12) -> None:
    from torch.profiler import ProfilerActivity, profile

    from decoding import sources
    for precision in ("float32", "bfloat16"):
        config, decode = _contender(precision)
        for batch in (1, 8):
            src = sources(config, batch)
            wall = _wall(decode, src, 64, 5)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                decode(src, 64)
            events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
            total = sum(e.self_device_time_total for e in events)  # microseconds
            print(f"\n{precision}, batch {batch}: {wall / 64 * 1e3:.3f} ms a token wall, "
                  f"{total / 64 / 1e3:.3f} ms of kernels (64-token decodes)")
            print("   us a token  calls a token  us a call  kernel")
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
                print(f"   {e.self_device_time_total / 64:10.1f}  {e.count / 64:13.1f}  "
                      f"{e.self_device_time_total / e.count:9.2f}  {e.key[:90]}")


def fixed() -> None:
    import torch

    import torch_impl.decoding as D
    import torch_impl.graphs as G
    from decoding import sources
    from torch_impl import search
    from torch_impl.model import Transformer
    config, decode = _contender("float32")
    for batch in (1, 8):
        src = sources(config, batch)
        ms = {n: _wall(decode, src, n, 7) * 1e3 for n in (2, 64, 128)}
        slope = (ms[128] - ms[64]) / 64
        print(f"batch {batch}: whole decodes of 2 / 64 / 128 tokens {ms[2]:.2f} / {ms[64]:.2f} / "
              f"{ms[128]:.2f} ms; a token from 64 to 128 {slope:.3f} ms; fixed (128 - 128 x that) "
              f"{ms[128] - 128 * slope:.2f} ms")

    spent = collections.defaultdict(float)

    def timed(owner, name):
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
                spent[name] += time.perf_counter() - start
        setattr(owner, name, wrapper)

    for owner, name in ((D, "_decode_inputs"), (D, "_graphed"), (Transformer, "_encode_for_decoding"),
                        (Transformer, "_encoder_weights"), (Transformer, "_init_cache"),
                        (Transformer, "_step_weights"), (G, "_kept"), (G._GreedyGraph, "reset"),
                        (search, "greedy_result")):
        timed(owner, name)
    print("each part of a decode, ms (timed between synchronisations, so the whole is slower; the "
          "encoder's and the cache's parts include the weights' checks below them):")
    for batch in (1, 8):
        src = sources(config, batch)
        for max_len in (2, 64):
            decode(src, max_len)
            spent.clear()
            for _ in range(9):
                torch.cuda.synchronize()
                start = time.perf_counter()
                decode(src, max_len)
                spent["whole decode"] += time.perf_counter() - start
            print(f"  batch {batch}, {max_len} tokens: " + ", ".join(
                f"{name} {seconds / 9 * 1e3:.3f}" for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1])))


def attention() -> None:
    import torch
    import torch.nn.functional as F

    from torch_impl.attention import _attend_by_products
    torch.backends.cuda.matmul.allow_tf32 = False
    print("one query's attention, 8 heads of 64, microseconds a call (12 calls replayed from one graph)")
    print("  dtype      keys    SDPA   products")
    for dtype in (torch.float32, torch.bfloat16):
        for keys in (32, 128):
            q = torch.randn(1, 8, 1, 64, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 8, keys, 64, device="cuda", dtype=dtype) for _ in range(2))
            bias = torch.zeros(1, 1, 1, keys, device="cuda", dtype=dtype)
            sdpa = _replayed(lambda: [F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                                      for _ in range(12)])
            products = _replayed(lambda: [_attend_by_products(q, k, v, bias) for _ in range(12)])
            print(f"  {str(dtype)[6:]:9s} {keys:5d} {sdpa / 12:7.2f} {products / 12:9.2f}")


def residual() -> None:
    import torch
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    half, full = torch.bfloat16, torch.float32
    stream = torch.randn(1, 512, device="cuda")
    x = torch.randn(1, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda") / 512 ** 0.5
    b = torch.randn(512, device="cuda")
    x16, w16, b16 = x.to(half), w.to(half), b.to(half)
    gamma, beta = torch.ones(512, device="cuda"), torch.zeros(512, device="cuda")
    variants = {
        "bfloat16 product, mixed-dtype add (the step's)": lambda: stream.add_(torch.addmm(b16, x16, w16)),
        "bfloat16 product, cast, float32 add": lambda: stream.add_(torch.addmm(b16, x16, w16).float()),
        "float32 product, float32 add (float32's step)": lambda: stream.add_(torch.addmm(b, x, w)),
        "layer norm, float32": lambda: F.layer_norm(stream, (512,), gamma, beta),
        "layer norm, cast to bfloat16": lambda: F.layer_norm(stream, (512,), gamma, beta).to(half),
        # last: where a capture fails, the ones after it might not capture
        "product written in float32 into the stream, bias added":
            lambda: (torch.addmm(stream, x16, w16, out_dtype=full, out=stream), stream.add_(b)),
    }
    print("one sublayer's output into the float32 residual stream, 1 x 512 from 512, microseconds a call"
          " (18 calls replayed from one graph)")
    for name, call in variants.items():
        try:
            print(f"  {name:58s} {_replayed(lambda: [call() for _ in range(18)]) / 18:7.2f}")
        except (RuntimeError, TypeError, NotImplementedError) as error:
            print(f"  {name:58s} fails: {str(error).splitlines()[0][:120]}")


def _replayed(work, replays: int = 500) -> float:
    """Microseconds a replay of ``work`` recorded as one CUDA graph, as decoding records its steps
    (`torch_impl.graphs._capture`: two warm-up runs on a side stream, then the capture)."""
    import torch

    from torch_impl.graphs import _capture
    graph, _ = _capture(work, torch.device("cuda"))
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / replays * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args(argv)
    if why := cuda_missing():
        parser.error(why)
    import torch
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, TF32 off, one CPU thread")
    for part in args.parts:
        print(f"\n== {part}")
        globals()[part]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
