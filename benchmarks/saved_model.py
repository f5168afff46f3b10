"""What a SavedModel export costs, and whether serving it costs more than tf_impl: greedy decoding
through the loaded ``serving_default`` signature against `tf_impl.greedy_decode` on the same model.

A preset (float32, dropout 0, `shared.weights.random_weights` seed 1) is exported with
`tf_impl.saved_model.export_saved_model` into a temporary directory and loaded back with
``tf.saved_model.load`` (in this process: the fresh-process check is the test suite's). Printed: the
export's time and size, the load time, each side's first call (tracing and the XLA compile of that
source shape), then the medians of interleaved repeats of whole decodes, their ratio, and whether
the tokens are identical.

    python3 dev.py bench saved_model [--preset small] [--batch 8] [--src-len 16] [--max-new 32]
                                     [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--src-len", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import tf_impl
    from shared import TransformerConfig
    from shared.batches import token_batch
    from shared.weights import random_weights
    from tf_impl.saved_model import export_saved_model

    config = TransformerConfig.preset(args.preset, dropout=0.0)
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, 1))
    src = token_batch(config, config.src_vocab, args.batch, args.src_len, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "served"
        start = time.perf_counter()
        export_saved_model(model, path, max_len=args.max_new)
        print(f"{args.preset}: export {time.perf_counter() - start:.2f} s, {_size(path) / 2**20:.1f} MiB")
        start = time.perf_counter()
        served = tf.saved_model.load(str(path)).signatures["serving_default"]
        print(f"load {time.perf_counter() - start:.2f} s")
        ids = tf.constant(src, tf.int64)

        def serve():
            return served(src=ids)["tokens"].numpy()

        def direct():
            return tf_impl.greedy_decode(model, src, args.max_new).tokens

        for label, run in (("served", serve), ("tf_impl", direct)):
            start = time.perf_counter()
            run()
            print(f"{label} first call (trace + compile): {time.perf_counter() - start:.2f} s")
        times: dict[str, list[float]] = {"served": [], "tf_impl": []}
        for _ in range(args.repeats):  # interleaved: a drifting machine hits both alike
            for label, run in (("served", serve), ("tf_impl", direct)):
                start = time.perf_counter()
                tokens = run()
                times[label].append(time.perf_counter() - start)
                if label == "served":
                    served_tokens = tokens
        a, b = statistics.median(times["served"]), statistics.median(times["tf_impl"])
        print(f"greedy, batch {args.batch} x {args.src_len}, {args.max_new} new tokens: served "
              f"{a:.4f} s, tf_impl {b:.4f} s (medians of {args.repeats}), ratio {a / b:.2f}")
        print(f"identical tokens: {bool(np.array_equal(served_tokens, direct()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
