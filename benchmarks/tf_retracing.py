"""What tf_impl's decoding keeps as the source shapes change: resident memory and time over
``--shapes`` decodes, each of a new (batch, length) and ``max_len`` from a few values.

A server decodes sources of every length. `tf_impl.decoding` compiles its loop as one
``tf.function`` per model and program; every trace and every XLA executable it makes is kept for
the model's life. This prints how much memory and time the sequence of shapes costs, with XLA
(the default of a cached decode, `tf_impl.decoding.JIT_COMPILE`) and without.

    python3 dev.py bench tf_retracing [--preset tiny] [--shapes 30]

Printed, per mode: the resident memory grown since the first decode (MiB) and the seconds, every
10 shapes. Run it on a quiet machine; the memory is a property of the code and the TF version.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def measure(preset: str, shapes: int, jit_compile: bool) -> None:
    """The sequence of decodes in this process, one line every 10 shapes."""
    import numpy as np

    import tf_impl
    from shared import TransformerConfig
    from shared.weights import random_weights

    config = TransformerConfig.preset(preset)
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, 0))
    rng = np.random.default_rng(0)
    tf_impl.greedy_decode(model, rng.integers(4, config.src_vocab, size=(1, 1)), 1, jit_compile=jit_compile)
    start_mib, start = _resident_mib(), time.perf_counter()
    for i in range(1, shapes + 1):
        length = 1 + i % min(40, config.max_len)
        src = rng.integers(4, config.src_vocab, size=(1 + i % 3, length))
        tf_impl.greedy_decode(model, src, 1 + i % 7, jit_compile=jit_compile)
        if i % 10 == 0 or i == shapes:
            print(f"  jit_compile={jit_compile!s:<5}  {i:>4} shapes  +{_resident_mib() - start_mib:7.0f} MiB  "
                  f"{time.perf_counter() - start:7.1f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--shapes", type=int, default=30)
    parser.add_argument("--mode", choices=("xla", "graph"), help=argparse.SUPPRESS)  # one child run
    args = parser.parse_args(argv)
    if args.mode:
        measure(args.preset, args.shapes, args.mode == "xla")
        return 0
    import tensorflow as tf
    print(f"tf_impl decoding over {args.shapes} source shapes, preset {args.preset}, TensorFlow "
          f"{tf.__version__}; each mode in a fresh process")
    for mode in ("xla", "graph"):
        subprocess.run([sys.executable, __file__, "--preset", args.preset, "--shapes", str(args.shapes),
                        "--mode", mode], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"})
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
