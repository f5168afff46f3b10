"""ONNX Runtime's session options for decoding, measured: the graph optimisation level, and idle
pool threads spinning or sleeping, on the `base` export of `benchmarks/decoding.py`'s weights.

Each setting decodes the same sources greedily (`twins.onnx_runtime`), interleaved over
``--rounds`` rounds so that the machine's drift touches every setting alike; printed: ms per step
(median) and the ratio to `twins.onnx_runtime.session_options`' own setting (the median of the
per-round ratios).

    python3 dev.py bench onnx_sessions [--batches 1 8] [--tokens 64] [--rounds 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # decoding, _decoding_contenders

from shared.threads import apply_thread_policy  # noqa: E402

apply_thread_policy()  # noqa: E402  (OMP_WAIT_POLICY before any runtime starts)

import onnxruntime as ort  # noqa: E402

from _decoding_contenders import bench_weights, scratch_dir  # noqa: E402
from decoding import sources  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.exporters.onnx import to_onnx  # noqa: E402
from twins import onnx_runtime  # noqa: E402

LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}


def settings(threads: int) -> dict:
    """name -> SessionOptions: the project's, then one change each."""
    out = {"project": onnx_runtime.session_options(threads)}
    for name, level in LEVELS.items():
        if name != "all":
            out[f"level {name}"] = onnx_runtime.session_options(threads)
            out[f"level {name}"].graph_optimization_level = level
    out["spinning"] = onnx_runtime.session_options(threads, spinning=True)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    config = TransformerConfig.preset("base")
    models = {}
    with scratch_dir("twins-bench-onnx-") as folder:  # the sessions keep what they loaded
        path = os.path.join(folder, "model")
        to_onnx(config, bench_weights(config), path)
        _, files = onnx_runtime.read_onnx(path)
        graphs = {name: str(file) for name, file in files.items()}
        for name, options in settings(args.threads).items():
            models[name] = onnx_runtime.OnnxRuntimeModel(config, graphs, options=options)
    print(f"onnxruntime {ort.__version__}, base float32, greedy, {args.tokens} new tokens, "
          f"{args.threads} intra-op threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"{'setting':<16} {'batch':>5} {'ms/step':>8}  vs project")
    for batch in args.batches:
        src = sources(config, batch)
        seconds = {name: [] for name in models}
        for model in models.values():
            model.greedy(src, args.tokens)  # warm-up
        for _ in range(args.rounds):
            for name, model in models.items():
                start = time.perf_counter()
                model.greedy(src, args.tokens)
                seconds[name].append(time.perf_counter() - start)
        for name, times in seconds.items():
            ratio = statistics.median(a / b for a, b in zip(times, seconds["project"]))
            print(f"{name:<16} {batch:>5} {statistics.median(times) / args.tokens * 1e3:>8.2f}  {ratio:.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
