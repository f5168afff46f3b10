"""The kernel layouts of torch_impl's decoding step (`torch_impl.cache.step_layout`), side by side.

Times the products one cached greedy step of preset ``base`` (float32) makes, for each row count
(``batch * beams``) and each layout (dense ``(in, out)`` as `step_layout` keeps it, every kernel
``(out, in)`` in memory, oneDNN-packed; and the dense kernels of the layers in one buffer, as a step
on the CPU keeps them, `torch_impl.cache.in_one_buffer`, against the same allocated apart; with a
torch built with MKL, MKL's own packing for that row count, CTranslate2's product on Intel CPUs,
which torch runs packed on that row count only, not a layout torch_impl keeps): every
decoder layer's stacked query/key/value, self-attention
output, cross-attention query and output, and the two feed-forward kernels, then the 37000-wide
output projection; each kernel through `torch_impl.cache.lay_out` and `dense`, the code the step
runs. There are 6 copies of every layer's kernels, about 160 MB with the projection, so that, as in
a step, the weights come from memory, not from the cache. Rounds are interleaved (every layout once
per round), so a machine whose speed drifts slows every layout alike. Printed: the median ms per
step's products over the rounds, their range, and each other layout's ratio to dense; which layout
`step_layout` picks for that row count. At one row also other operations on the same kernels:
``torch.addmv`` on the dense ones, oneDNN's packing tuned for one row instead of eight, MKL's
own packed product (CTranslate2's on Intel CPUs), and NumPy's BLAS (the OpenBLAS its wheels bundle,
limited to ``--threads``; not a kernel torch_impl runs: a measure of what a one-row product can
take on this CPU, where torch's own are slower than CTranslate2's).

Then the same for the products of a decode's one encoder pass over ``--encoder-rows`` rows (``batch
* source length``: 32 and 256 are batch 1 and 8 of the decoding benchmark's 32-token sources): every
encoder layer's kernels as ``nn.Linear`` runs them (``F.linear`` on the ``(out, in)`` weight: what
the model's forward and, where nothing is packed, a decode run; query, key and value apart) against
`torch_impl.cache.EncoderWeights` packed (`Encoder.infer`: query, key and value in one product),
and the same kernels packed by MKL for that row count.

    python3 dev.py bench step_layouts [--rows 1 2 4 8 16] [--encoder-rows 32 256] [--rounds 5]
                                      [--repeats 20] [--threads 1]

Measured (quiet 2-core AMD EPYC with AVX-512, torch 2.13 CPU, 1 thread, OMP_WAIT_POLICY=PASSIVE,
THP_MEM_ALLOC_ENABLE=1, 5 rounds of 20): docs/performance.md, "Kernel layouts" and "The CPU
contenders on two CPUs", which this script reproduces.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from shared import TransformerConfig  # noqa: E402
from shared.threads import apply_thread_policy, thread_count  # noqa: E402


ONE_BUFFER = "dense, one buffer"  # the dense kernels as `torch_impl.cache.in_one_buffer` keeps them


_RATIO_WIDTH = 22  # a ratio column's: its head ("MKL packed/nn.Linear") and a space before it


def _header(names: list[str], note: str) -> None:
    """The column heads of `main`'s tables: each contender's ms, then each other's ratio to the first."""
    cells = "  ".join(f"{name + ' ms (range)':22s}" for name in names)
    ratios = "".join(f"{name + '/' + names[0]:>{_RATIO_WIDTH}s}" for name in names[1:])
    print(f" rows   {cells}{ratios}   {note}")


def _openblas_threads(threads: int) -> str | None:
    """Limit the OpenBLAS that NumPy loaded to ``threads`` threads, through its own
    ``*openblas_set_num_threads*`` entry point (NumPy reads ``OPENBLAS_NUM_THREADS`` only when it
    is imported, before ``--threads`` is known). Returns the library's file name, or None where
    this process has no OpenBLAS (NumPy built on another BLAS) or it has no such entry point."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        library = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(library, name):
                getattr(library, name)(ctypes.c_int(threads))
                return Path(path).name
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--encoder-rows", nargs="+", type=int, default=[32, 256])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per layout and round")
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import numpy as np
    import torch

    from torch_impl.cache import (DENSE, DENSE_OUT_IN, PACKED, StepWeights, dense, in_one_buffer, lay_out,
                                  step_layout)

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
    mkl = torch.backends.mkl.is_available()  # a torch built with MKL (x86-64 wheels are)
    _header(["dense", "(out, in)", "packed", "one buffer"] + ["MKL packed"] * mkl,
            "step_layout picks" + "; MKL packed: for that row count" * mkl)
    layouts = (DENSE, DENSE_OUT_IN, PACKED)
    laid = {layout: [(lay_out(k, layout), b) for k, b in kernels] for layout in layouts}
    names = ("qkv", "self_output", "cross_query", "cross_output", "inner", "outer")  # a step's order
    layers = [StepWeights(**{f"{n}_{part}": t for n, pair in zip(names, laid[DENSE][at:at + 6])
                             for part, t in zip(("kernel", "bias"), pair)},
                          cross_kv_kernel=torch.empty(0), cross_kv_bias=torch.empty(0))  # not a step's
              for at in range(0, len(laid[DENSE]) - 1, 6)]
    # the dense kernels as a step on the CPU keeps them: each layer's in one buffer, in reading order
    laid[ONE_BUFFER] = [(getattr(w, f"{n}_kernel"), getattr(w, f"{n}_bias"))
                        for w in in_one_buffer(layers, torch.device("cpu")) for n in names] + laid[DENSE][-1:]

    def laid_out(x_of: dict, kernel: torch.Tensor, bias: torch.Tensor) -> None:
        """`dense`, the step's product, on a `lay_out` kernel (packed: ``(out, in)``)."""
        dense(x_of[kernel.shape[1] if kernel.is_mkldnn else kernel.shape[0]], kernel, bias)

    def linear(x_of: dict, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """``nn.Linear``'s product: F.linear on the ``(out, in)`` weight."""
        torch.nn.functional.linear(x_of[weight.shape[1]], weight, bias)

    def addmv(x_of: dict, kernel: torch.Tensor, bias: torch.Tensor) -> None:
        """A matrix-vector product on a dense ``(in, out)`` kernel (one row only)."""
        torch.addmv(bias, kernel.t(), x_of[kernel.shape[0]][0])

    def mkl_packed(x_of: dict, packed: tuple, bias: torch.Tensor) -> None:
        """MKL's own packed product (``cblas_sgemm_compute``, what CTranslate2 runs on Intel CPUs)
        on ``(packed, (out, in) weight, rows packed for)`` (`packed_by_mkl`)."""
        weight_packed, weight, rows = packed
        torch.ops.mkl._mkl_linear(x_of[weight.shape[1]], weight_packed, weight, bias, rows)

    def packed_by_mkl(pairs: list, rows: int) -> list:
        """``(kernel (in, out), bias)`` pairs packed by MKL for ``rows`` rows: torch's
        ``_mkl_linear`` runs the packed product only on that many rows (on any other count it
        falls back to ``F.linear`` on the weight), so a packing serves one row count."""
        return [((torch.ops.mkl._mkl_reorder_linear_weight(k.t().contiguous(), rows), k.t().contiguous(),
                  rows), b) for k, b in pairs]

    def numpy_blas(x_of: dict, kernel, bias) -> None:
        """NumPy's product (its BLAS) on the dense ``(in, out)`` kernel, as NumPy arrays sharing
        the tensors' memory; the bias added after, as ``np.dot`` has none."""
        np.dot(x_of[kernel.shape[0]].numpy(), kernel) + bias

    def products(layers: list[tuple[torch.Tensor, torch.Tensor]], xs: dict, op) -> None:
        for kernel, bias in layers:
            op(xs, kernel, bias)

    def compare(rows: int, contenders: dict) -> tuple[dict, dict]:
        """Median ms and every round's ms of each contender ``{name: (layers, op)}``'s products."""
        xs = {n: torch.randn(rows, n, generator=g) for n in (d, inner, ff)}
        for layers, op in contenders.values():
            products(layers, xs, op)  # first-call allocations
        ms = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, (layers, op) in contenders.items():
                start = time.perf_counter()
                for _ in range(args.repeats):
                    products(layers, xs, op)
                ms[name].append((time.perf_counter() - start) / args.repeats * 1e3)
        return {name: statistics.median(v) for name, v in ms.items()}, ms

    def row(rows: int, med: dict, ms: dict, names: tuple, note: str = "") -> None:
        """One row: each contender's median (range), then every other's ratio to the first."""
        cells = "  ".join(f"{f'{med[n]:7.2f} ({min(ms[n]):.2f}-{max(ms[n]):.2f})':22s}" for n in names)
        ratios = "".join(f"{f'{med[n] / med[names[0]]:.2f}x':>{_RATIO_WIDTH}s}" for n in names[1:])
        print(f"{rows:5d}   {cells}{ratios}   {note}", flush=True)

    for rows in args.rows:
        contenders = {layout: (laid[layout], laid_out) for layout in (*layouts, ONE_BUFFER)}
        if mkl:
            contenders["MKL packed"] = (packed_by_mkl(kernels, rows), mkl_packed)
        med, ms = compare(rows, contenders)
        row(rows, med, ms, tuple(contenders), step_layout(rows, torch.device("cpu"), torch.float32))
    if 1 in args.rows:  # other operations for one row, on the same kernels
        packed_for_one = [(torch.ops.mkldnn._reorder_linear_weight(k.t().contiguous(), 1), b)
                          for k, b in kernels]
        contenders = {"dense": (laid[DENSE], laid_out), "addmv": (laid[DENSE], addmv),
                      "packed(1)": (packed_for_one, laid_out)}
        if mkl:
            contenders["MKL packed"] = (packed_by_mkl(kernels, 1), mkl_packed)
        if openblas := _openblas_threads(args.threads):
            contenders["NumPy BLAS"] = ([(k.numpy(), b.numpy()) for k, b in laid[DENSE]], numpy_blas)
        else:
            print("NumPy BLAS: not timed (NumPy runs no OpenBLAS here whose threads can be limited)")
        _header(list(contenders), "packed(1): oneDNN's, for one row"
                + (f"; NumPy BLAS: {openblas}" if openblas else ""))
        med, ms = compare(1, contenders)
        row(1, med, ms, tuple(contenders))

    # The encoder pass: (q, k, v, output, inner, outer) per layer as nn.Linear holds them, against
    # EncoderWeights packed (q|k|v, output, inner, outer).
    encoder = [(torch.randn(o, i, generator=g) * i ** -0.5, torch.randn(o, generator=g))
               for _ in range(config.n_encoder_layers)
               for i, o in [(d, inner), (d, inner), (d, inner), (inner, d), (d, ff), (ff, d)]]
    stacked = []  # (kernel (in, out), bias), as lay_out takes them
    for layer in range(config.n_encoder_layers):
        q, k, v, out, ffn_in, ffn_out = encoder[6 * layer: 6 * layer + 6]
        qkv = (torch.cat([q[0], k[0], v[0]]).t(), torch.cat([q[1], k[1], v[1]]))
        stacked += [(w.t() if n else w, b) for n, (w, b) in enumerate([qkv, out, ffn_in, ffn_out])]
    packed = [(lay_out(k, PACKED), b) for k, b in stacked]
    megabytes = sum(w.numel() for w, _ in encoder) * 4 / 1e6
    print(f"encoder pass: {len(encoder)} nn.Linear products against {len(packed)} packed, "
          f"{megabytes:.0f} MB of kernels")
    _header(["nn.Linear", "packed"] + ["MKL packed"] * mkl,
            "GFLOP/s" + "; MKL packed: for that row count, the packed kernels" * mkl)
    for rows in args.encoder_rows:
        contenders = {"linear": (encoder, linear), "packed": (packed, laid_out)}
        if mkl:
            contenders["MKL packed"] = (packed_by_mkl(stacked, rows), mkl_packed)
        med, ms = compare(rows, contenders)
        flops = 2 * rows * megabytes / 4 * 1e6
        row(rows, med, ms, tuple(contenders), " vs ".join(f"{flops / med[n] / 1e6:.0f}" for n in contenders)
            + " GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
